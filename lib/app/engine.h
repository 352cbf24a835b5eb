// What `spotvisor daemon`, `run` and `config` share: load the configuration
// from its layers (waiting for the metadata server where it is required),
// check it against this machine, and run the supervisor.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "log/logger.h"
#include "metadata/metadata_client.h"
#include "retry/sleeper.h"

namespace spotvisor {

enum class Mode { kDaemon, kRun, kConfig };

inline constexpr char kDefaultConfigPath[] = "/etc/spotvisor/spotvisor.conf";
inline constexpr int kExitConfigError = 78;  // EX_CONFIG

struct EngineOptions {
  Mode mode = Mode::kRun;
  std::string config_path = kDefaultConfigPath;
  bool config_path_given = false;  // a missing file is then an error
  std::vector<std::pair<std::string, std::string>> sets;
  std::vector<std::string> command;  // after --
  // From --set log-format=..., so it applies from the very first line.
  LogFormat log_format = LogFormat::kAuto;
};

struct MetadataSnapshot {
  bool available = false;
  std::map<std::string, std::string> instance_attributes, project_attributes;
  std::string instance_name;
  MetadataValue preempted, maintenance;
  std::string preemptible;  // instance/scheduling/preemptible: "TRUE" on legacy preemptible VMs
  std::string on_host_maintenance;  // instance/scheduling/on-host-maintenance: TERMINATE or MIGRATE ("" unknown)
  std::map<std::string, std::string> scheduling;  // instance/scheduling/?recursive=true (GCE's own limits, if given)
  std::string project_id, zone;  // zone: the last segment of instance/zone
  std::string instance_id;
  bool default_address = false;  // answered at 169.254.169.254 itself: we are on GCE
};

// Daemon mode, or GCE_METADATA_HOST set: metadata is required, so retry
// until it answers (logging once per failure streak) or `sleeper` is
// cancelled. Otherwise one quick attempt; unreachable means "not on GCE".
StatusOr<MetadataSnapshot> LoadMetadata(MetadataClient& client, bool required, Logger& logger, Sleeper& sleeper);

// Layers file < project < instance < command line, with mode-dependent defaults.
ConfigResult LoadConfig(const EngineOptions& options, const MetadataSnapshot& metadata);

// Checks that need the machine: the user exists (and we may switch to it),
// directories can be created. Adds to result.errors.
void PrepareHost(ConfigResult& result, Mode mode);

// `spotvisor daemon` / `spotvisor run`: returns the process exit code.
int RunEngine(const EngineOptions& options);
// `spotvisor config`: prints the resolved configuration and its sources.
int PrintConfig(const EngineOptions& options, bool json);

}  // namespace spotvisor
