// One typed configuration, resolved once from four layers (defaults < file <
// project metadata < instance metadata < command line), remembering where
// every value came from so `spotvisor config` can show it and errors can
// name it.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config_file.h"

namespace spotvisor {

enum class ConfigSource { kDefault, kFile, kProjectMetadata, kInstanceMetadata, kCommandLine };
const char* ConfigSourceName(ConfigSource s);

enum class OnExit { kPoweroff, kNone, kStop, kDelete };
const char* OnExitName(OnExit o);
enum class LogFormat { kAuto, kJson, kText };
enum class LogTo { kAuto, kStdout, kApi, kJournald };

struct ConfigValue {
  std::string value;
  ConfigSource source = ConfigSource::kDefault;
  // Where it was set, as errors should name it:
  // "instance metadata spotvisor-stop-timeout", "/etc/spotvisor/spotvisor.conf:12 stop-timeout".
  std::string origin;
};

struct ConfigInputs {
  std::string file_path;                        // for messages
  std::vector<FileEntry> file_entries;
  std::map<std::string, std::string> project_attributes;  // all custom metadata
  std::map<std::string, std::string> instance_attributes;
  // How the two metadata layers are named in messages: GCE's project and
  // instance metadata, or EC2's user data and instance tags.
  std::string project_layer = "project metadata";
  std::string instance_layer = "instance metadata";
  std::vector<std::pair<std::string, std::string>> cli_sets;  // --set KEY=VALUE
  std::vector<std::string> cli_command;         // after --
  // Defaults that depend on the machine or the mode: user, run-id, on-exit, workdir.
  std::map<std::string, std::string> dynamic_defaults;
};

struct Config {
  std::vector<std::string> argv;  // what is exec'ed
  std::string command;            // as the user wrote it, for logs
  bool exec_form = false;
  std::string user;
  std::string workdir;  // empty: the user's home directory
  std::vector<std::pair<std::string, std::string>> env;
  std::string checkpoint_dir;
  std::string run_id;
  std::string state_dir;
  std::chrono::milliseconds stop_timeout{20'000};
  std::chrono::milliseconds kill_timeout{5'000};
  std::chrono::milliseconds progress_interval{5'000};
  std::chrono::milliseconds metadata_watch_timeout{60'000};
  OnExit on_exit = OnExit::kNone;
  std::optional<OnExit> on_exit_success, on_exit_failure;  // unset: on_exit
  std::string compute_endpoint;
  std::string group = "auto";  // auto | none | a group (compute/group.h); resolved in app/group.cc
  int max_failed_boots = 3;    // 0: no limit
  bool group_delete_when_empty = false;
  std::chrono::milliseconds stop_check_interval{30'000};  // RUN_ID/STOP; 0: never
  std::string shutdown_command;
  LogFormat log_format = LogFormat::kAuto;
  LogTo log_to = LogTo::kAuto;
  std::string cloud = "auto";  // auto | gce | aws
  std::string logging_endpoint;
  std::string log_group;  // CloudWatch Logs, on EC2
  std::map<std::string, std::string> log_labels;
  std::string bucket;  // empty: no checkpoint sync
  std::chrono::milliseconds sync_interval{600'000};
  std::chrono::milliseconds sync_alert_after{1'800'000};  // 0: never
  bool sync_stall_stop = false;                          // sync-stall-action = stop
  std::chrono::milliseconds checkpoint_report_interval{60'000};  // 0: never
  int sync_parallelism = 4;
  std::uint64_t sync_parallel_min_size = 64u << 20;  // 0: never parallel parts
  std::chrono::milliseconds sync_settle{10'000};
  std::chrono::milliseconds run_claim_ttl{600'000};  // run/claim.h
  std::string storage_endpoint;
  bool restart_on_failure = false;
  int max_restarts = 3;
  std::chrono::milliseconds restart_delay{10'000};
  std::chrono::milliseconds max_runtime{0};  // 0: none
  std::chrono::milliseconds maintenance_stop_lead{0};
  std::chrono::milliseconds maintenance_stop_before{300'000};
  std::chrono::milliseconds preemption_notice{0};  // 0: none known
  std::chrono::milliseconds preemption_stop_lead{0};
  std::chrono::milliseconds preemption_window{30'000};
  std::chrono::milliseconds on_exit_timeout{60'000};
  std::chrono::milliseconds on_failure_hold{0};
  std::chrono::milliseconds idle_timeout{0};
  int idle_threshold = 5;
  // Mounts (issue #4); empty disk / bucket_mount: not mounted.
  std::string dataset_disk, dataset_dir, dataset_mount_options;
  std::string scratch_disk, scratch_dir;
  std::string bucket_mount;
  std::string mount_driver = "gcsfuse";
  std::vector<std::string> mount_options;  // extra flags for the driver
  std::chrono::milliseconds mount_timeout{60'000};
  bool sync_via_mount = false;  // sync-via = mount: copy into bucket-mount
  // Gang training (issue #16); empty gang: none.
  std::string gang;
  int gang_size = 0;
  std::vector<std::string> gang_etcd;  // endpoints
  std::string gang_etcd_ca, gang_etcd_cert, gang_etcd_key, gang_etcd_user, gang_etcd_password;
  std::chrono::milliseconds gang_form_timeout{600'000};
  bool gang_wait_on_loss = false;  // gang-on-loss = wait
  bool gang_checkpoint_all = false;
  // gang-launch = leader: only rank 0 runs the command (mpiexec); the others
  // host its processes, reached over ssh (sshd on gang_ssh_port), trusting
  // the leader's per-generation key through gang_ssh_authorized_keys (empty:
  // the trainer user's ~/.ssh/authorized_keys).
  bool gang_launch_leader = false;
  int gang_ssh_port = 22;
  std::string gang_ssh_authorized_keys;  // gang-checkpoint = all: every rank syncs its own dir (sync/checkpoint_set.h)
  std::chrono::milliseconds gang_reform_timeout{1'800'000};
  std::chrono::milliseconds gang_lease_ttl{10'000};
  std::string gang_address;  // empty: the private IP from metadata
  int gang_master_port = 29500;
};

struct ConfigResult {
  std::map<std::string, ConfigValue> values;  // the merged layers, every known key
  std::vector<std::string> errors;            // each names source, key and problem
  std::vector<std::string> warnings;
  std::optional<Config> config;               // set when errors is empty
};

ConfigResult ResolveConfig(const ConfigInputs& inputs);

// The run id a configuration names, also when other keys are broken (so
// that config.error and run.end carry it, issue #32): the run-id key, or
// the gang's name when run-id is left at its default. "" when that is not
// a valid run id.
std::string RunIdOf(const ConfigResult& r);

// "KEY=value" for --set; the error says what was wrong.
StatusOr<std::pair<std::string, std::string>> ParseSetFlag(const std::string& arg);

// Anything to mount (issue #4): a dataset disk, a scratch disk or the bucket.
inline bool HasMounts(const Config& c) {
  return !c.dataset_disk.empty() || !c.scratch_disk.empty() || !c.bucket_mount.empty();
}

// STATE_DIR/committed.json: what the bucket holds, for the trainer to read.
inline std::string CommittedFilePath(const std::string& state_dir) { return state_dir + "/committed.json"; }

// The environment variables spotvisor gives every trainer, on top of `env`.
std::vector<std::pair<std::string, std::string>> SpotvisorEnv(const Config& c);

// A CloudWatch Logs group name as the API takes it (the log-group key):
// 1-512 of A-Z a-z 0-9 _ - / . #.
bool ValidLogGroupName(std::string_view name);

}  // namespace spotvisor
