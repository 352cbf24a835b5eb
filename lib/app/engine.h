// What `spotvisor daemon`, `run` and `config` share: load the configuration
// from its layers (waiting for the metadata server where it is required),
// check it against this machine, and run the supervisor.
#pragma once

#include <map>
#include <memory>
#include <optional>
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
  std::string preemptible;  // instance/scheduling/preemptible: "TRUE" on Spot and legacy preemptible VMs
  std::string provisioning_model;  // instance/scheduling/provisioning-model: SPOT, STANDARD, ... ("" not said)
  std::string on_host_maintenance;  // instance/scheduling/on-host-maintenance: TERMINATE or MIGRATE ("" unknown)
  std::map<std::string, std::string> scheduling;  // instance/scheduling/?recursive=true (GCE's own limits, if given)
  std::string project_id, zone;  // zone: the last segment of instance/zone
  std::string instance_id;
  bool default_address = false;  // answered at 169.254.169.254 itself (no override): we are on GCE or EC2
  std::string cloud;  // "gce", "aws", or "" (no metadata service)
  std::string region;  // EC2: placement/region
  // The VM's private IPv4 (GCE: network-interfaces/0/ip; EC2: local-ipv4),
  // "" when not given or not plain: what gang members reach each other at.
  std::string private_ip;
  // EC2: instance-metadata tags are not enabled (tags/instance is 404).
  bool ec2_tags_hidden = false;
  // EC2: the tag aws:autoscaling:groupName (app/group.h); GCE's created-by
  // is among instance_attributes.
  std::optional<std::string> asg_name;
  // Problems with a metadata layer itself (a user-data section that does
  // not parse): configuration errors.
  std::vector<std::string> errors;
};

// EC2's user data may carry spotvisor's configuration as a section of the
// config file's `KEY = value` lines, from a line `[spotvisor]` to the next
// `[...]` line or the end; anything else in the user data (a cloud-init
// script) is left alone. Returns KEY -> value as spotvisor-KEY attributes.
StatusOr<std::map<std::string, std::string>> ParseUserDataSection(std::string_view user_data);

// Daemon mode, or GCE_METADATA_HOST set: metadata is required, so retry
// until it answers (logging once per failure streak) or `sleeper` is
// cancelled. Otherwise one quick attempt; unreachable means "not on GCE".
StatusOr<MetadataSnapshot> LoadMetadata(MetadataClient& client, bool required, Logger& logger, Sleeper& sleeper);

// Which cloud (the `cloud` key from the command line or config file; auto:
// GCE_METADATA_HOST or AWS_EC2_METADATA_SERVICE_ENDPOINT set picks one, else
// both services are asked at once) and its metadata. Required as
// LoadMetadata says (and on EC2 when its endpoint is set).
class ImdsClient;
// `ctx` cuts the EC2 requests short (a stop while starting); the GCE client
// is cancelled through its own Cancel().
StatusOr<MetadataSnapshot> LoadCloud(const EngineOptions& options, MetadataClient& gce, ImdsClient& imds, Logger& logger,
                                     Sleeper& sleeper, const CallContext& ctx);

// Layers file < project (EC2: user data) < instance (EC2: tags) < command
// line, with mode-dependent defaults.
ConfigResult LoadConfig(const EngineOptions& options, const MetadataSnapshot& metadata);

// Checks that need the machine: the user exists (and we may switch to it),
// directories can be created. Adds to result.errors.
void PrepareHost(ConfigResult& result, Mode mode);

// The gang session of a config with `gang` set (issue #16): this VM as a
// member (its instance name, and gang-address or the private IP from the
// metadata server), talking to etcd through `sleeper`. kInvalidArgument
// when this VM's address or name is not known.
class GangSession;
StatusOr<std::shared_ptr<GangSession>> MakeGangSession(const Config& c, const MetadataSnapshot& metadata, Logger& logger,
                                                       const Clock& clock, Sleeper& sleeper);

// `spotvisor daemon` / `spotvisor run`: returns the process exit code.
int RunEngine(const EngineOptions& options);
// `spotvisor config`: prints the resolved configuration and its sources.
int PrintConfig(const EngineOptions& options, bool json);

}  // namespace spotvisor
