#include "app/engine.h"
#include "app/cloud.h"
#include "app/group.h"

#include <algorithm>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/asio.h"
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <future>
#include <thread>

#include <fmt/format.h>

#include "common/duration.h"
#include "sync/checkpoint_set.h"
#include "common/strings.h"
#include "compute/compute_client.h"
#include "compute/ec2_client.h"
#include "config/keys.h"
#include "storage/file_object_store.h"
#include "storage/gcs_object_store.h"
#include "storage/s3_object_store.h"
#include "common/worker_pool.h"
#include "log/async_sink.h"
#include "log/cloud_logging_sink.h"
#include "log/cloudwatch_logs_sink.h"
#include "log/journald_sink.h"
#include "config/config_file.h"
#include "metadata/ec2_notices.h"
#include "metadata/imds_client.h"
#include "metadata/scheduling.h"
#include "metadata/upcoming_maintenance.h"
#include "output/utf8.h"
#include "metadata/watcher.h"
#include "mount/guarded_store.h"
#include "mount/mount_manager.h"
#include "mount/mounter.h"
#include "process/proc.h"
#include "process/spawn.h"
#include "process/user.h"
#include "retry/retry_loop.h"
#include "supervisor/supervisor.h"

extern char** environ;

namespace spotvisor {
namespace {

bool EnvSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}


namespace asio = boost::asio;

StatusOr<MetadataSnapshot> FetchOnce(MetadataClient& client) {
  MetadataSnapshot m;
  auto inst = client.GetAttributes("instance/attributes/");
  if (!inst.ok()) return inst.status();
  auto proj = client.GetAttributes("project/attributes/");
  if (!proj.ok()) return proj.status();
  auto name = client.Get("instance/name");
  if (!name.ok()) return name.status();
  m.instance_attributes = *std::move(inst);
  m.project_attributes = *std::move(proj);
  m.instance_name = name->value;
  // Not every VM defines these (404); that simply means "no event".
  for (auto [path, out, none] : {std::tuple{"instance/preempted", &m.preempted, "FALSE"},
                                 std::tuple{"instance/maintenance-event", &m.maintenance, "NONE"}}) {
    auto v = client.Get(path);
    if (v.ok()) {
      *out = *std::move(v);
    } else if (v.status().code() == StatusCode::kNotFound) {
      *out = MetadataValue{none, ""};
    } else {
      return v.status();
    }
  }
  if (auto p = client.Get("instance/scheduling/preemptible"); p.ok()) m.preemptible = p->value;
  if (auto p = client.Get("instance/scheduling/provisioning-model"); p.ok()) m.provisioning_model = std::string(Trim(p->value));
  if (auto p = client.Get("instance/scheduling/on-host-maintenance"); p.ok()) m.on_host_maintenance = std::string(Trim(p->value));
  if (auto s = client.GetAttributes("instance/scheduling/"); s.ok()) m.scheduling = *std::move(s);
  if (auto p = client.Get("project/project-id"); p.ok()) m.project_id = p->value;
  if (auto id = client.Get("instance/id"); id.ok()) m.instance_id = id->value;
  if (auto z = client.Get("instance/zone"); z.ok()) m.zone = z->value.substr(z->value.rfind('/') + 1);
  if (auto ip = client.Get("instance/network-interfaces/0/ip"); ip.ok()) m.private_ip = std::string(Trim(ip->value));
  m.available = true;
  return m;
}

// A value from the metadata service that goes into names and labels:
// printable ASCII, not empty, not huge.
bool PlainValue(std::string_view v) {
  if (v.empty() || v.size() > 256) return false;
  for (unsigned char c : v) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

// EC2: identity, tags (spotvisor-KEY or spotvisor:KEY) as the instance layer,
// the user data's [spotvisor] section as the project layer, and whether an
// interruption notice is already there.
StatusOr<MetadataSnapshot> FetchEc2Once(ImdsClient& imds, const CallContext& ctx) {
  MetadataSnapshot m;
  auto id = imds.Get("meta-data/instance-id", ctx);
  if (!id.ok()) return id.status();
  std::string instance(Trim(*id));
  if (!PlainValue(instance)) return UnavailableError("EC2 metadata: instance-id is not an instance id");
  m.instance_name = m.instance_id = instance;
  if (auto z = imds.Get("meta-data/placement/availability-zone", ctx); z.ok() && PlainValue(Trim(*z))) {
    m.zone = std::string(Trim(*z));
  }
  if (auto ip = imds.Get("meta-data/local-ipv4", ctx); ip.ok() && PlainValue(Trim(*ip))) {
    m.private_ip = std::string(Trim(*ip));
  }
  if (auto r = imds.Get("meta-data/placement/region", ctx); r.ok() && PlainValue(Trim(*r))) {
    m.region = std::string(Trim(*r));
  } else {
    m.region = RegionOfZone(m.zone);
  }
  auto keys = imds.Get("meta-data/tags/instance", ctx);
  if (keys.ok()) {
    for (auto const& line : SplitLines(*keys)) {
      std::string key(Trim(line));
      if (key == "aws:autoscaling:groupName") {
        auto v = imds.Get("meta-data/tags/instance/" + key, ctx);
        if (!v.ok()) return v.status();
        m.asg_name = *v;
        continue;
      }
      std::string rest;
      if (StartsWith(key, "spotvisor-") || StartsWith(key, "spotvisor:")) rest = key.substr(10);
      if (rest.empty()) continue;
      bool plain = rest.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos;
      if (!plain) {
        m.errors.push_back(fmt::format("instance tag {}: not a spotvisor key (lower-case letters, digits and '-')",
                                       output::EscapeInvalidUtf8(key.substr(0, 100))));
        continue;
      }
      auto v = imds.Get("meta-data/tags/instance/" + key, ctx);
      if (!v.ok()) return v.status();
      m.instance_attributes[kMetadataPrefix + rest] = *v;
    }
  } else if (keys.status().code() == StatusCode::kNotFound) {
    m.ec2_tags_hidden = true;
  } else {
    return keys.status();
  }
  auto ud = imds.Get("user-data", ctx);
  if (ud.ok()) {
    auto section = ParseUserDataSection(*ud);
    if (section.ok()) {
      m.project_attributes = *std::move(section);
    } else {
      m.errors.push_back(section.status().message());
    }
  } else if (ud.status().code() != StatusCode::kNotFound) {
    return ud.status();
  }
  auto action = imds.Get("meta-data/spot/instance-action", ctx);
  if (action.ok()) {
    // Already being taken: no trainer start (the watcher's first poll gives the deadline).
    m.preempted = MetadataValue{"TRUE", ""};
  } else if (action.status().code() != StatusCode::kNotFound) {
    return action.status();
  }
  m.cloud = "aws";
  m.available = true;
  return m;
}

std::string Hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return std::string(buf);
}

bool UnderMount(const Config& c, const std::string& path) {
  return (!c.dataset_disk.empty() && PathIsUnder(path, c.dataset_dir)) ||
         (!c.scratch_disk.empty() && PathIsUnder(path, c.scratch_dir)) || PathIsUnder(path, c.bucket_mount);
}

std::vector<std::string> BaseEnv(const std::optional<UserInfo>& user) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    auto name = kv.substr(0, kv.find('='));
    // systemd's channels are ours, not the trainer's.
    if (name == "NOTIFY_SOCKET" || name == "WATCHDOG_PID" || name == "WATCHDOG_USEC") continue;
    if (user && (name == "HOME" || name == "USER" || name == "LOGNAME" || name == "SHELL")) continue;
    env.emplace_back(kv);
  }
  if (user) {
    env.push_back("HOME=" + user->home);
    env.push_back("USER=" + user->name);
    env.push_back("LOGNAME=" + user->name);
    if (!user->shell.empty()) env.push_back("SHELL=" + user->shell);
  }
  return env;
}

void SetUpLogging(Logger& logger, LogFormat format) {
  logger.ClearSinks();
  bool text = format == LogFormat::kText || (format == LogFormat::kAuto && isatty(STDOUT_FILENO));
  logger.AddSink(std::make_unique<AsyncSink>(text ? MakeTextSink(stdout) : MakeJsonSink(stdout)));
}

// After a configuration error the configuration cannot be trusted with an
// API call: only "none" is honoured as written (from on-exit-failure, else
// on-exit); anything else powers off in daemon mode.
std::string OnExitValue(const ConfigResult& r, Mode mode) {
  for (const char* key : {"on-exit-failure", "on-exit"}) {
    auto it = r.values.find(key);
    std::string v = it == r.values.end() ? "" : std::string(Trim(it->second.value));
    if (v == "none") return v;
    if (v == "poweroff" || v == "stop" || v == "delete") return "poweroff";
  }
  return mode == Mode::kDaemon ? "poweroff" : "none";
}

// A VM whose configuration is broken must not sit there billing: in daemon
// mode the on-exit action still runs (unless on-exit itself says none). In a
// group (`leave` set) the VM leaves the group instead, which would bring a
// powered-off VM back with the same configuration, boot after boot.
int EndWithConfigError(const ConfigResult& r, Mode mode, Logger& logger, GroupClient* leave = nullptr,
                       const InstanceGroup* group = nullptr) {
  for (auto const& e : r.errors) logger.Error("config.error", e);
  logger.Log(LogEvent{Severity::kError, "run.end",
                      fmt::format("run ended: config-error ({} problem(s); see config.error above)", r.errors.size()),
                      {{"reason", "config-error"}, {"exit_code", kExitConfigError}}});
  logger.Flush(std::chrono::seconds(10));
  if (OnExitValue(r, mode) != "poweroff") return kExitConfigError;
  if (leave && group && LeaveAfterConfigError(*leave, *group, logger)) {
    logger.Flush(std::chrono::seconds(5));
    return kExitConfigError;
  }
  std::string cmd = r.values.count("shutdown-command") ? r.values.at("shutdown-command").value : "";
  if (cmd.empty()) cmd = FindKey("shutdown-command")->default_value;
  logger.Log(LogEvent{Severity::kNotice, "shutdown.start", fmt::format("on-exit poweroff: running `{}`", cmd),
                      {{"command", cmd}, {"action", "poweroff"}}});
  SpawnOptions so;
  so.argv = {"/bin/sh", "-c", cmd};
  so.env = BaseEnv(std::nullopt);
  auto p = Spawn(so);
  if (!p.ok()) {
    logger.Error("shutdown.failed", p.status().message());
    return kExitConfigError;
  }
  int status = 0;
  while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  logger.Log(LogEvent{code == 0 ? Severity::kInfo : Severity::kError, "shutdown.done",
                      fmt::format("shutdown command exited with code {}", code), {{"exit_code", code}}});
  return kExitConfigError;
}

// log-to, read from the raw values so that it works even when some other
// key is invalid (the error itself must reach the log API): the cloud's own
// (Cloud Logging on GCE, CloudWatch Logs on EC2).
Status AddCloudLogging(const ConfigResult& r, const MetadataSnapshot& metadata, Cloud* cloud, Logger& logger) {
  std::string log_to(Trim(r.values.at("log-to").value));
  if (!(log_to == "api" || (log_to == "auto" && metadata.default_address))) return OkStatus();
  if (cloud == nullptr) {
    return FailedPreconditionError(
        "log-to: api needs a metadata server (GCE: project, zone, instance id and a token; EC2: instance id and "
        "region), and none answered");
  }
  std::string description;
  nlohmann::json fields = nlohmann::json::object();
  auto sink = cloud->MakeLogSink(r, description, fields);
  if (!sink.ok()) return sink.status();
  logger.AddSink(std::move(*sink));
  logger.Info("log.api", description, std::move(fields));
  return OkStatus();
}

// What both bucket clients share. Google's guidance (and AWS's):
// exponential backoff with jitter; a sync gives up after two minutes (the
// next periodic sync tries again). Objects described as `gcloud storage ls
// -L` shows them: JSON for the manifest and DONE, the trainer's own path on
// each checkpoint object. sync-parallelism bounds every transfer, parts and
// ranges included; the final sync inside a Spot window may use twice as many.
template <typename Options>
void SetTransferOptions(Options& o, const Config& c, const Clock& clock) {
  o.make_retry = [&clock] { return std::make_unique<LimitedTimeRetryPolicy>(std::chrono::minutes(2), clock); };
  o.make_backoff = [] {
    return std::make_unique<ExponentialBackoffPolicy>(std::chrono::milliseconds(500), std::chrono::seconds(32), 2.0);
  };
  o.describe = DescribeRunObject;
  o.streams = c.sync_parallelism;
  o.urgent_streams = std::min(64, 2 * c.sync_parallelism);
  o.parallel_min_bytes = static_cast<std::size_t>(c.sync_parallel_min_size);
}

// The Cloud Storage JSON API client for gs://BUCKET, objects under `prefix`.
std::unique_ptr<ObjectStore> MakeGcsStore(const Config& c, const std::string& bucket, const std::string& prefix, Mode mode,
                                          const Clock& clock) {
  GcsOptions o;
  bool auth = true;
  o.endpoint = StorageEndpoint(c.storage_endpoint, auth);
  o.bucket = bucket;
  o.prefix = prefix;
  SetTransferOptions(o, c, clock);
  std::unique_ptr<TokenProvider> tokens =
      auth ? std::unique_ptr<TokenProvider>(std::make_unique<MetadataTokenProvider>(NewMetadataClient(mode), clock))
           : MakeNoAuthTokenProvider();
  return MakeGcsObjectStore(std::move(o), std::move(tokens));
}

// S3 for s3://BUCKET, objects under `prefix`: the same parallelism and
// retry budget; credentials from the environment or the instance role.
std::unique_ptr<ObjectStore> MakeS3Store(const Config& c, const std::string& bucket, const std::string& prefix,
                                         const std::string& instance_region, const Clock& clock) {
  S3Options o;
  // As the AWS SDKs do on EC2: AWS_REGION or AWS_DEFAULT_REGION, else the
  // instance's own region (a bucket elsewhere is still followed).
  if (!EnvSet("AWS_REGION") && !EnvSet("AWS_DEFAULT_REGION")) o.region = instance_region;
  o.bucket = bucket;
  o.prefix = prefix;
  SetTransferOptions(o, c, clock);
  o.clock = &clock;
  auto creds = DefaultAwsCredentials(clock);
  // A malformed key in the environment: every request fails with the reason.
  std::unique_ptr<AwsCredentialProvider> provider =
      creds.ok() ? std::move(*creds)
                 : std::make_unique<FailingAwsCredentials>(creds.status());
  return MakeS3ObjectStore(std::move(o), std::move(provider));
}

std::shared_ptr<SyncEngine> MakeSyncEngine(const Config& c, const MetadataSnapshot& metadata, Mode mode,
                                           const Clock& clock, GangStores* gang_stores) {
  auto loc = ParseStoreLocation(c.bucket);  // validated with the config
  std::unique_ptr<ObjectStore> store;
  if (loc->scheme == "file") {
    store = MakeFileObjectStore(loc->prefix + "/" + c.run_id);
  } else if (c.sync_via_mount) {
    // The same layout, through the FUSE mount of the whole bucket: files are
    // written to a temporary name, fsynced, closed (gcsfuse uploads on close)
    // and renamed.
    auto dir = c.bucket_mount;
    store = GuardByMount(MakeFileObjectStore(dir + "/" + (loc->prefix.empty() ? "" : loc->prefix + "/") + c.run_id),
                         [dir] { return CheckFuseMounted(dir); });
  } else if (loc->scheme == "s3") {
    store = MakeS3Store(c, loc->bucket, loc->prefix.empty() ? c.run_id : loc->prefix + "/" + c.run_id,
                        metadata.cloud == "aws" ? metadata.region : "", clock);
  } else {
    store = MakeGcsStore(c, loc->bucket, loc->prefix.empty() ? c.run_id : loc->prefix + "/" + c.run_id, mode, clock);
  }
  SyncOptions so;
  // The run's root (PREFIX/RUN_ID), shared: the sync engine's store (or, in a
  // gang-checkpoint = all run, the rank's view of it) and the run's claim.
  auto run_store = std::shared_ptr<ObjectStore>(std::move(store));
  if (gang_stores) gang_stores->claims = run_store;
  if (!c.gang.empty() && c.gang_checkpoint_all && gang_stores) {
    // gang-checkpoint = all: this rank's own commits under RUN_ID/rank-K/
    // (K known once the gang formed), the sets' shares pinned.
    gang_stores->run = run_store;
    gang_stores->rank = std::make_shared<RankStore>(gang_stores->run);
    auto rank_store = gang_stores->rank;
    store = std::make_unique<SharedStore>(rank_store);
    so.pinned_prefix = kSetsDir;
    so.done_once = true;
  } else {
    store = std::make_unique<SharedStore>(run_store);
  }
  so.checkpoint_dir = c.checkpoint_dir;
  so.run_id = c.run_id;
  so.instance = metadata.instance_name;
  so.parallelism = c.sync_parallelism;
  so.urgent_parallelism = std::min(64, 2 * c.sync_parallelism);
  so.settle = c.sync_settle;
  // What this disk last committed or restored: a restart keeps newer local files.
  so.state_file = c.state_dir + "/checkpoint-state.json";
  so.committed_file = CommittedFilePath(c.state_dir);
  so.bucket_wins = !c.gang.empty();  // gang-checkpoint = leader: every rank starts from rank 0's commit
  if (auto u = LookupUser(c.user); u.ok() && geteuid() == 0 && u->uid != 0) {
    so.owner_uid = u->uid;
    so.owner_gid = u->gid;
  }
  return std::make_shared<SyncEngine>(std::move(store), std::move(so), clock);
}

// GCE's own limits on this VM, where instance/scheduling/ gives them: a
// preemption notice lengthens the final sync's window (unless
// preemption-notice is set); --max-run-duration / --termination-time end the
// VM without a graceful stop, so max-runtime must come first.
void WarnAboutGceLimits(const MetadataSnapshot& metadata, Config& config, const Clock& clock, Logger& logger) {
  auto limits = ReadGceLimits(metadata.scheduling);
  nlohmann::json f = nlohmann::json::object();
  std::vector<std::string> said;
  if (limits.preemption_notice) {
    f["preemption_notice_s"] = std::chrono::duration<double>(*limits.preemption_notice).count();
    said.push_back("preemption notice " + FormatDuration(*limits.preemption_notice));
    if (config.preemption_notice.count() == 0 && config.preemption_stop_lead <= *limits.preemption_notice) {
      config.preemption_notice = *limits.preemption_notice;
    }
  }
  std::string source;
  if (limits.max_run_duration) {
    f["max_run_duration_s"] = std::chrono::duration<double>(*limits.max_run_duration).count();
    source = "--max-run-duration " + FormatDuration(*limits.max_run_duration) + " from its start";
    said.push_back("max run duration " + FormatDuration(*limits.max_run_duration));
  }
  if (limits.termination_time) {
    f["termination_time"] = limits.termination_time_text;
    if (!source.empty()) source += ", ";
    source += "--termination-time " + limits.termination_time_text;
    said.push_back("termination time " + limits.termination_time_text);
  }
  if (said.empty()) return;
  std::string list;
  for (auto const& s : said) list += (list.empty() ? "" : "; ") + s;
  logger.Info("scheduling.limits", "GCE's limits on this VM (instance/scheduling/): " + list, f);
  timespec up{};
  if (clock_gettime(CLOCK_BOOTTIME, &up) != 0) return;
  // The VM started when this kernel booted (a stopped VM that is started again boots again).
  auto booted = clock.WallNow() - std::chrono::seconds(up.tv_sec) - std::chrono::nanoseconds(up.tv_nsec);
  auto end = GceEnd(limits, std::chrono::time_point_cast<WallTime::duration>(booted));
  if (!end) return;
  auto budget = config.stop_timeout + config.kill_timeout + std::chrono::minutes(5);
  if (auto w = GceLimitWarning(*end, clock.WallNow(), config.max_runtime, budget, source); !w.empty()) {
    logger.Warn("config.warning", w);
  }
}

// Seed 002's trap: the default storage scope is read-only, so a bucket
// mount (and every upload) fails with 403 much later. Say so up front.
void WarnAboutScopes(MetadataClient& client, Logger& logger) {
  auto scopes = client.Get("instance/service-accounts/default/scopes");
  if (!scopes.ok()) {
    logger.Warn("mount.scopes", "cannot read the VM's service-account scopes: " + scopes.status().message());
    return;
  }
  for (auto const& line : SplitLines(scopes->value)) {
    auto scope = std::string(Trim(line));
    if (scope.ends_with("/auth/cloud-platform") || scope.ends_with("/auth/devstorage.read_write") ||
        scope.ends_with("/auth/devstorage.full_control")) {
      return;
    }
  }
  logger.Warn("mount.scopes",
              "the VM's service account has no scope that can write to Cloud Storage (the default is read-only): the bucket "
              "mount and checkpoint uploads will fail with 403; create the VM with --scopes=storage-full (or "
              "cloud-platform)",
              {{"scopes", scopes->value}});
}

}  // namespace

StatusOr<MetadataSnapshot> LoadMetadata(MetadataClient& client, bool required, Logger& logger, Sleeper& sleeper) {
  if (!required) {
    auto m = FetchOnce(client);
    if (!m.ok() && !IsPermanentFailure(m.status())) {
      logger.Info("metadata.absent", fmt::format("no metadata server ({}); running without metadata: "
                                                 "no metadata config, no preemption watch", m.status().message()));
      return MetadataSnapshot{};
    }
    return m;
  }
  RetryForeverPolicy retry;
  ExponentialBackoffPolicy backoff(std::chrono::milliseconds(500), std::chrono::seconds(30), 2.0);
  int failures = 0;
  // GETs of the metadata server change nothing: safe to repeat.
  auto result = RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [&] { return FetchOnce(client); },
                          [&](const Status& s, int attempt, std::chrono::milliseconds) {
                            failures = attempt;
                            if (attempt == 1) {
                              logger.Warn("metadata.unavailable",
                                          fmt::format("waiting for the metadata server: {}; retrying with backoff", s.message()),
                                          {{"error", s.message()}});
                            }
                          });
  if (result.ok() && failures > 0) {
    logger.Info("metadata.recovered", fmt::format("metadata server answered after {} failed attempt(s)", failures),
                {{"failed_attempts", failures}});
  }
  return result;
}

StatusOr<std::map<std::string, std::string>> ParseUserDataSection(std::string_view user_data) {
  std::string section;
  bool in = false, found = false;
  for (auto const& raw : SplitLines(user_data)) {
    auto line = Trim(raw);
    if (!line.empty() && line.front() == '[') {
      in = line == "[spotvisor]";
      found = found || in;
      section += '\n';  // keeps the line numbers of errors right
      continue;
    }
    section += in ? std::string(raw) : std::string();
    section += '\n';
  }
  std::map<std::string, std::string> out;
  if (!found) return out;
  auto entries = ParseConfigText(section, "user data [spotvisor]");
  if (!entries.ok()) return entries.status();
  for (auto const& e : *entries) out[kMetadataPrefix + e.key] = e.value;
  return out;
}

namespace {

// The cloud key, before any metadata is read: the command line, else the
// config file (metadata cannot say where metadata comes from).
std::string CloudKey(const EngineOptions& o) {
  std::string v;
  if (auto entries = ReadConfigFile(o.config_path); entries.ok()) {
    for (auto const& e : *entries) {
      if (e.key == "cloud") v = e.value;
    }
  }
  for (auto const& [k, val] : o.sets) {
    if (k == "cloud") v = val;
  }
  return std::string(Trim(v));
}

}  // namespace

StatusOr<MetadataSnapshot> LoadCloud(const EngineOptions& o, MetadataClient& gce, ImdsClient& imds, Logger& logger,
                                     Sleeper& sleeper, const CallContext& ctx) {
  std::string cloud = CloudKey(o);
  bool required = MetadataRequired(o.mode) || EnvSet("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (cloud == "auto" || cloud.empty()) {
    if (EnvSet("GCE_METADATA_HOST")) cloud = "gce";
    else if (EnvSet("AWS_EC2_METADATA_SERVICE_ENDPOINT")) cloud = "aws";
  }
  if (cloud == "gce") {
    auto m = LoadMetadata(gce, MetadataRequired(o.mode) || o.mode == Mode::kDaemon, logger, sleeper);
    if (m.ok() && m->available) m->cloud = "gce";
    return m;
  }
  // Both asked at once, each bounded (the probes' connect timeouts are short
  // off their cloud; on the other cloud the wrong service answers 404 at once).
  auto probe = [&]() -> std::pair<StatusOr<MetadataSnapshot>, StatusOr<MetadataSnapshot>> {
    std::future<StatusOr<MetadataSnapshot>> g;
    if (cloud != "aws") g = std::async(std::launch::async, [&] { return FetchOnce(gce); });
    auto a = cloud != "gce" ? FetchEc2Once(imds, ctx) : StatusOr<MetadataSnapshot>(UnavailableError("not asked"));
    auto gr = g.valid() ? g.get() : StatusOr<MetadataSnapshot>(UnavailableError("not asked"));
    return {std::move(gr), std::move(a)};
  };
  auto pick = [&](std::pair<StatusOr<MetadataSnapshot>, StatusOr<MetadataSnapshot>>& r) -> StatusOr<MetadataSnapshot> {
    if (r.first.ok()) {
      r.first->cloud = "gce";
      return std::move(r.first);
    }
    if (r.second.ok()) return std::move(r.second);
    return UnavailableError(cloud == "aws" ? fmt::format("EC2 metadata service: {}", r.second.status().message())
                                           : fmt::format("no metadata service answered (GCE: {}; EC2: {})",
                                                         r.first.status().message(), r.second.status().message()));
  };
  auto first = probe();
  auto got = pick(first);
  if (got.ok() || !required) {
    if (!got.ok()) {
      logger.Info("metadata.absent", fmt::format("{}; running without metadata: no metadata config, no preemption "
                                                 "watch", got.status().message()));
      return MetadataSnapshot{};
    }
    return got;
  }
  RetryForeverPolicy retry;
  ExponentialBackoffPolicy backoff(std::chrono::milliseconds(500), std::chrono::seconds(30), 2.0);
  logger.Warn("metadata.unavailable", fmt::format("waiting for a metadata service: {}; retrying with backoff",
                                                  got.status().message()),
              {{"error", got.status().message()}});
  int failures = 1;
  auto result = RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [&] {
    auto r = probe();
    return pick(r);
  }, [&](const Status&, int attempt, std::chrono::milliseconds) { failures = attempt + 1; });
  if (result.ok()) {
    logger.Info("metadata.recovered", fmt::format("metadata service answered after {} failed attempt(s)", failures),
                {{"failed_attempts", failures}});
  }
  return result;
}

ConfigResult LoadConfig(const EngineOptions& o, const MetadataSnapshot& metadata) {
  ConfigInputs in;
  in.file_path = o.config_path;
  in.project_attributes = metadata.project_attributes;
  in.instance_attributes = metadata.instance_attributes;
  if (metadata.cloud == "aws") {
    in.project_layer = "user data";
    in.instance_layer = "instance tag";
  }
  in.cli_sets = o.sets;
  in.cli_command = o.command;
  in.dynamic_defaults = {
      {"user", CurrentUserName()},
      {"run-id", metadata.instance_name.empty() ? Hostname() : metadata.instance_name},
      {"on-exit", o.mode == Mode::kDaemon ? "poweroff" : "none"},
  };
  if (o.mode != Mode::kDaemon) {
    std::error_code ec;
    in.dynamic_defaults["workdir"] = std::filesystem::current_path(ec).string();
  }
  std::vector<std::string> file_errors;
  auto parsed = ReadConfigFileLines(o.config_path);
  if (parsed.ok()) {
    // The good lines count as well: every other mistake is reported in the
    // same pass, and nothing is said to be missing that a good line gives.
    in.file_entries = std::move(parsed->entries);
    file_errors = std::move(parsed->errors);
  } else if (o.config_path_given || parsed.status().code() != StatusCode::kNotFound) {
    file_errors.push_back(parsed.status().message());
  }
  auto r = ResolveConfig(in);
  r.errors.insert(r.errors.begin(), file_errors.begin(), file_errors.end());
  r.errors.insert(r.errors.end(), metadata.errors.begin(), metadata.errors.end());
  if (auto it = r.values.find("cloud"); it != r.values.end() &&
      (it->second.source == ConfigSource::kProjectMetadata || it->second.source == ConfigSource::kInstanceMetadata)) {
    r.warnings.push_back(fmt::format("{}: ignored: which cloud's metadata to read is decided before metadata is read; "
                                     "set cloud in the config file or with --set",
                                     it->second.origin));
  }
  if (!file_errors.empty()) r.config.reset();
  return r;
}

namespace {

// Issue #32: a checkpoint dir the trainer's user cannot write was found at
// its first save, an epoch after the GPU started billing. Tried before the
// trainer starts; spotvisor fixes what is its own to fix (the default
// checkpoint dir, which the package makes as root), else the run ends at
// once with the fix in the message. The workdir only gets a warning: a
// trainer need not write there.
void ProbeTrainerDir(ConfigResult& r, const char* key, const std::string& dir, const UserInfo& user) {
  auto probe = ProbeWritable(dir, user);
  if (probe.ok()) return;
  auto origin = r.values.at(key).origin;
  bool ours = std::string_view(key) == "checkpoint-dir" && dir == FindKey("checkpoint-dir")->default_value;
  if (ours && geteuid() == 0) {
    if (auto g = GiveTreeTo(dir, user); g.ok() && ProbeWritable(dir, user).ok()) {
      r.warnings.push_back(fmt::format("{}: {}: spotvisor gave {} (its own default directory) to user {}", origin,
                                       probe.message(), dir, user.name));
      return;
    }
  }
  std::string fix = geteuid() == 0 ? fmt::format("`chown -R {} {}`, or set user to an owner of it", user.name, dir)
                                   : fmt::format("make it writable for {} (`sudo chown -R {} {}`), or set {} to a directory "
                                                 "{} can write",
                                                 user.name, user.name, dir, key, user.name);
  std::string message = fmt::format("{}: {}: the trainer could not {} there; fix: {}", origin, probe.message(),
                                    std::string_view(key) == "checkpoint-dir" ? "save its checkpoints" : "write its files", fix);
  if (std::string_view(key) == "checkpoint-dir") {
    r.errors.push_back(message);
  } else {
    r.warnings.push_back(message);
  }
}

}  // namespace

void PrepareHost(ConfigResult& r, Mode mode) {
  if (!r.config) return;
  Config& c = *r.config;
  auto origin = [&](const char* key) { return r.values.at(key).origin; };
  auto user = LookupUser(c.user);
  if (!user.ok()) {
    r.errors.push_back(fmt::format("{}: {}", origin("user"), user.status().message()));
  } else if (geteuid() != 0 && user->uid != geteuid()) {
    r.errors.push_back(fmt::format("{}: cannot run the trainer as {}: spotvisor runs as {}, not root", origin("user"),
                                   c.user, CurrentUserName()));
  }
  std::optional<UserInfo> owner;
  if (user.ok()) owner = *user;
  if (user.ok() && c.workdir.empty()) c.workdir = user->home;
  if (mode != Mode::kConfig) {
    for (auto [key, dir, own] : {std::tuple{"workdir", &c.workdir, true}, std::tuple{"checkpoint-dir", &c.checkpoint_dir, true},
                                 std::tuple{"state-dir", &c.state_dir, false}}) {
      // On a disk that is not mounted yet: created after the mounts.
      if (dir->empty() || UnderMount(c, *dir)) continue;
      auto s = MakeDirs(*dir, own ? owner : std::nullopt);
      if (!s.ok()) {
        r.errors.push_back(fmt::format("{}: {}", origin(key), s.message()));
        continue;
      }
      if (own && user.ok()) ProbeTrainerDir(r, key, *dir, *user);
    }
  }
  if (!r.errors.empty()) r.config.reset();
}

int RunEngine(const EngineOptions& options) {
  // tini's model: every thread spotvisor starts (log sinks, watchers, the
  // worker pool) inherits a mask with every signal blocked; only this
  // thread takes them, inside io.run(), through the signal_set below.
  BlockSignalsInThisThread();
  SystemClock clock;
  Logger logger(clock);
  SetUpLogging(logger, options.log_format);
  asio::io_context io;
  // Installed first and kept to the end, so no SIGTERM ever meets a default
  // handler: during bootstrap it cancels the wait for metadata.
  asio::signal_set signals(io, SIGINT, SIGTERM, SIGCHLD);
  signals.add(SIGUSR1);  // `spotvisor sync`: sync checkpoints now
  signals.add(SIGUSR2);  // `spotvisor release`: end an on-failure-hold
  signals.add(SIGHUP);   // the terminal went away: stop the run, as SIGTERM
  signals.add(SIGQUIT);  // stop now: as a second SIGTERM (the ladder escalates)
  const std::vector<int> handled = {SIGINT, SIGTERM, SIGCHLD, SIGUSR1, SIGUSR2, SIGHUP, SIGQUIT};

  CancellableSleeper sleeper;
  auto metadata_client = NewMetadataClient(options.mode);
  auto imds = MakeImdsClient(ImdsOptions{}, clock);
  CallContext boot_ctx;
  boot_ctx.cancel = std::make_shared<CancelSource>();
  std::optional<StatusOr<MetadataSnapshot>> loaded;
  int stop_signal = 0;
  std::thread bootstrap = StartSignalFreeThread([&] {
    auto m = LoadCloud(options, *metadata_client, *imds, logger, sleeper, boot_ctx);
    asio::post(io, [&, m = std::move(m)]() mutable {
      loaded = std::move(m);
      signals.cancel();
    });
  });
  std::function<void(boost::system::error_code, int)> on_signal = [&](boost::system::error_code ec, int signo) {
    if (ec) return;
    if (signo == SIGCHLD || signo == SIGUSR1 || signo == SIGUSR2) {
      signals.async_wait(on_signal);
      return;
    }
    stop_signal = signo;
    sleeper.Cancel();
    metadata_client->Cancel();
    boot_ctx.cancel->Cancel();
  };
  signals.async_wait(on_signal);
  {
    SignalWindow window(handled);
    io.run();
  }
  bootstrap.join();
  io.restart();

  if (stop_signal != 0) {
    logger.Log(LogEvent{Severity::kWarning, "run.end", fmt::format("run ended: stopped by signal {} while starting", stop_signal),
                        {{"reason", "stopped"}, {"exit_code", 128 + stop_signal}}});
    return 128 + stop_signal;
  }
  if (!loaded->ok()) {
    logger.Error("metadata.error", loaded->status().message());
    ConfigResult r;
    r.errors.push_back("metadata server: " + loaded->status().message());
    return EndWithConfigError(r, options.mode, logger);
  }
  MetadataSnapshot metadata = **std::move(loaded);
  {
    // Answered at the link-local address itself, not at an override: we
    // are on that cloud (log-to = auto writes to its log API).
    metadata.default_address = (metadata.cloud == "gce" && !EnvSet("GCE_METADATA_HOST")) ||
                               (metadata.cloud == "aws" && !EnvSet("AWS_EC2_METADATA_SERVICE_ENDPOINT"));
  }
  const bool on_gce = metadata.available && metadata.cloud == "gce";
  std::unique_ptr<Cloud> cloud = MakeCloud(metadata, options.mode, clock);
  auto result = LoadConfig(options, metadata);
  PrepareHost(result, options.mode);
  if (!result.errors.empty()) result.config.reset();
  // The local sink first (it replaces what is there), the API sink after.
  if (result.config && result.config->log_to == LogTo::kJournald) {
    // Instead of stdout: the journal gets native fields, not JSON to parse.
    logger.ClearSinks();
    logger.AddSink(std::make_unique<AsyncSink>(MakeJournaldSink()));
  } else if (result.config && result.config->log_format != options.log_format) {
    SetUpLogging(logger, result.config->log_format);
  }
  // Labels first, so every line about this run carries them.
  if (!metadata.instance_name.empty()) logger.SetLabel("instance", metadata.instance_name);
  if (result.config) {
    logger.SetLabel("run_id", result.config->run_id);
  } else if (auto id = RunIdOf(result); !id.empty()) {
    logger.SetLabel("run_id", id);  // a broken config still names its run (issue #32)
  }
  // Cloud Logging before the first warning or error: "why did my VM power
  // off right away" is answered by a config.error entry there.
  if (auto s = AddCloudLogging(result, metadata, cloud.get(), logger); !s.ok()) {
    result.errors.push_back(s.message());
    result.config.reset();
  }
  if (cloud) cloud->Announce(logger);
  for (auto const& w : result.warnings) logger.Warn("config.warning", w);
  // The group (issue #30), from the raw value: a configuration error must
  // still leave it.
  std::optional<InstanceGroup> group;
  std::unique_ptr<GroupClient> config_error_leave;
  if (auto g = ResolveGroup(result.values.at("group").value, metadata); !g.ok()) {
    result.errors.push_back(g.status().message());
    result.config.reset();
  } else {
    group = g->group;
    if (!g->note.empty()) logger.Warn("cloud.group_unknown", g->note);
  }
  if (group) AnnounceGroup(*group, logger);
  if (!result.config) {
    if (group && cloud) {
      std::string endpoint(Trim(result.values.at("compute-endpoint").value));
      while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
      config_error_leave = cloud->MakeGroupClient(*group, endpoint, sleeper);
    }
    return EndWithConfigError(result, options.mode, logger, config_error_leave.get(), group ? &*group : nullptr);
  }
  Config config = *result.config;
  // Legacy preemptible VMs are always stopped after 24 h; a run that hits
  // that wall gets no graceful stop unless max-runtime comes first. Spot VMs
  // report scheduling/preemptible=TRUE as well, but provisioning-model SPOT:
  // no limit, no warning (issue #32: every Spot run was warned).
  if (metadata.preemptible == "TRUE" && metadata.provisioning_model != "SPOT" &&
      (config.max_runtime.count() == 0 || config.max_runtime >= std::chrono::hours(24))) {
    logger.Warn("config.warning",
                metadata.provisioning_model.empty()
                    ? "this VM is preemptible and the metadata server does not say whether it is Spot: if it is a "
                      "legacy preemptible VM, GCE stops it after 24h; set spotvisor-max-runtime (e.g. 23h30m) so the "
                      "trainer is stopped and its checkpoint synced before that"
                    : fmt::format("this is a legacy preemptible VM (provisioning model {}, not SPOT): GCE stops it "
                                  "after 24h; set spotvisor-max-runtime (e.g. 23h30m) so the trainer is stopped and its "
                                  "checkpoint synced before that, or use a Spot VM (--provisioning-model=SPOT)",
                                  output::EscapeInvalidUtf8(metadata.provisioning_model.substr(0, 40))));
  }
  for (auto const& [k, v] : config.log_labels) logger.SetLabel(k, v);
  WarnAboutGceLimits(metadata, config, clock, logger);

  CancellableSleeper tag_sleeper;  // outlives the tag writer (declared before `so`)
  CancellableSleeper etcd_sleeper;  // outlives the gang session
  SupervisorOptions so;
  so.config = config;
  so.mode = options.mode == Mode::kDaemon ? "daemon" : "run";
  so.already_preempted = metadata.preempted.value == "TRUE";
  so.maintenance_terminate = metadata.maintenance.value == "TERMINATE_ON_HOST_MAINTENANCE";
  so.on_host_maintenance = metadata.on_host_maintenance;
  so.instance = metadata.instance_name;
  if (auto u = LookupUser(config.user); u.ok() && u->uid != geteuid()) so.user = *u;
  so.base_env = BaseEnv(so.user);
  if (!config.bucket.empty()) {
    GangStores gang_stores;
    so.sync = MakeSyncEngine(config, metadata, options.mode, clock, &gang_stores);
    so.gang_run_store = gang_stores.run;
    so.gang_rank_store = gang_stores.rank;
    so.claim = std::make_shared<RunClaim>(gang_stores.claims, config.run_id,
                                          metadata.instance_name.empty() ? Hostname() : metadata.instance_name,
                                          std::chrono::duration_cast<std::chrono::seconds>(config.run_claim_ttl), clock);
    so.boot = std::make_shared<BootRecord>(gang_stores.claims, config.run_id,
                                           metadata.instance_name.empty() ? Hostname() : metadata.instance_name,
                                           metadata.zone, so.claim->token(), clock);
    if (group) so.boot->SetGroup(group->Path());
    so.budget = std::make_shared<RunBudget>(gang_stores.claims, config.run_id, config.max_failed_boots, clock);
    logger.Info("sync.configured",
                fmt::format("checkpoints in {} are synced to {} every {}", config.checkpoint_dir, so.sync->Describe(),
                            config.sync_interval.count() ? FormatDuration(config.sync_interval) : std::string("(final sync only)")),
                {{"bucket", so.sync->Describe()}});
  }
  if (cloud) cloud->AddInstanceControl(config, so, tag_sleeper, logger);
  if (group && cloud) {
    so.group = group;
    Cloud* c = cloud.get();
    auto g = *group;
    auto endpoint = config.compute_endpoint;
    so.make_group = [c, g, endpoint](Sleeper& s) { return c->MakeGroupClient(g, endpoint, s); };
  }
  if (!config.gang.empty()) {
    auto gang = MakeGangSession(config, metadata, logger, clock, etcd_sleeper);
    if (!gang.ok()) {
      ConfigResult r;
      r.errors.push_back(gang.status().message());
      return EndWithConfigError(r, options.mode, logger);
    }
    so.gang = *std::move(gang);
  }
  so.notifier = MakeSystemdNotifier();
  std::unique_ptr<Mounter> mounter;
  if (HasMounts(config)) {
    MountOptions mo;
    mo.dataset_disk = config.dataset_disk;
    if (group) mo.missing_disk_hint = RegionalDatasetHint(*group, metadata.zone);
    mo.dataset_dir = config.dataset_dir;
    mo.dataset_options = config.dataset_mount_options;
    mo.scratch_disk = config.scratch_disk;
    mo.scratch_dir = config.scratch_dir;
    mo.bucket_mount = config.bucket_mount;
    mo.bucket = config.bucket;
    mo.driver = config.mount_driver;
    mo.extra_args = config.mount_options;
    bool auth = true;
    mo.storage_endpoint = StorageEndpoint(config.storage_endpoint, auth);
    mo.storage_auth = auth;
    if (auto u = LookupUser(config.user); u.ok()) mo.owner = *u;
    mo.base_env = BaseEnv(std::nullopt);
    mo.timeout = config.mount_timeout;
    for (auto const* d : {&config.workdir, &config.checkpoint_dir}) {
      if (!d->empty() && UnderMount(config, *d)) mo.dirs_after_mount.push_back(*d);
    }
    if (!config.bucket_mount.empty()) {
      // Through the API first: a FUSE driver may mount a bucket that does not
      // exist (rclone does) and fail only on first use; this names the
      // problem (missing bucket, missing permission or scope) up front.
      auto loc = ParseStoreLocation(config.bucket);
      std::shared_ptr<ObjectStore> check = MakeGcsStore(config, loc->bucket, loc->prefix, options.mode, clock);
      mo.check_bucket = [check] { return check->CheckAccess(Background()); };
    }
    mounter = MakeSystemMounter();
    so.mounts = std::make_shared<MountManager>(std::move(mo), *mounter, *so.children, clock, logger);
    if (!config.bucket_mount.empty() && on_gce) WarnAboutScopes(*metadata_client, logger);
  }
  Supervisor supervisor(io, clock, logger, std::move(so), signals);

  std::unique_ptr<NoticeWatch> notices;
  if (cloud) notices = cloud->WatchNotices(config, supervisor, logger, group);
  supervisor.Start();
  if (notices) notices->Start();
  {
    SignalWindow window(handled);
    io.run();
  }
  if (notices) notices->Stop();
  // Whatever the on-exit action, the run's last lines are delivered before
  // spotvisor exits, within a deadline: short when the VM is going down (a
  // preemption leaves ~30 s in all, and Cloud Logging may be what is slow).
  logger.Flush(supervisor.FinalFlushBudget());
  return supervisor.exit_code();
}

}  // namespace spotvisor

namespace spotvisor {

namespace {
// A secret is shown as whether it is set, never as itself.
std::string ShownValue(const KeySpec& k, const std::string& value) {
  if (!k.secret || value.empty()) return value;
  return "(set, hidden)";
}
}  // namespace

namespace {

// FNV-1a, 64 bits, as hex: the same command gives the same hash on every
// machine and every version (std::hash promises neither).
std::string CommandHash(const std::string& command) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : command) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

int CountGpus() {
  int n = 0;
  for (int i = 0; i < 64; ++i) {
    if (access(fmt::format("/dev/nvidia{}", i).c_str(), F_OK) == 0) ++n;
  }
  return n;
}

}  // namespace

StatusOr<std::shared_ptr<GangSession>> MakeGangSession(const Config& c, const MetadataSnapshot& metadata, Logger& logger,
                                                       const Clock& clock, Sleeper& sleeper) {
  GangSessionOptions o;
  o.etcd.endpoints = c.gang_etcd;
  o.etcd.ca_file = c.gang_etcd_ca;
  o.etcd.cert_file = c.gang_etcd_cert;
  o.etcd.key_file = c.gang_etcd_key;
  o.etcd.user = c.gang_etcd_user;
  o.etcd.password = c.gang_etcd_password;
  o.gang.name = c.gang;
  o.gang.size = c.gang_size;
  o.gang.member_ttl = std::chrono::duration_cast<std::chrono::seconds>(c.gang_lease_ttl);
  o.gang.leader_completes = c.gang_launch_leader;  // rank 0's command is the work
  o.self.instance = metadata.instance_name.empty() ? Hostname() : metadata.instance_name;
  o.self.ip = c.gang_address.empty() ? metadata.private_ip : c.gang_address;
  o.self.zone = metadata.zone;
  o.self.boot_id = BootId();
  o.self.command_hash = CommandHash(c.command);
  o.self.run_id = c.run_id;
  o.self.bucket = c.bucket;
  o.self.checkpoint = c.gang_checkpoint_all ? "all" : "leader";
  o.self.launch = c.gang_launch_leader ? "leader" : "each";
  o.self.gpus = CountGpus();
  o.self.size = c.gang_size;
  bool plain = !o.self.ip.empty() && o.self.ip.size() <= 64 &&
               o.self.ip.find_first_not_of("0123456789abcdefABCDEF.:") == std::string::npos;
  if (!plain) {
    return InvalidArgumentError(
        o.self.ip.empty() ? std::string("gang: this VM's private IP is not known (the metadata server did not give "
                                        "one): set gang-address to the address the other members reach it at")
                          : fmt::format("gang: the private IP from the metadata server, \"{}\", is not an IP "
                                        "address: set gang-address",
                                        output::EscapeInvalidUtf8(o.self.ip.substr(0, 64))));
  }
  if (o.self.instance.empty() || o.self.instance.find('/') != std::string::npos) {
    return InvalidArgumentError("gang: this VM's instance name is empty or holds '/': it names the member in etcd");
  }
  auto etcd = MakeEtcdClient(o.etcd, sleeper, clock);
  return std::make_shared<GangSession>(std::move(o), std::move(etcd), logger, clock);
}

int PrintConfig(const EngineOptions& options, bool json) {
  SystemClock clock;
  Logger logger(clock);
  // Progress notes go to stderr so stdout stays the configuration alone.
  logger.AddSink(isatty(STDERR_FILENO) ? MakeTextSink(stderr) : MakeJsonSink(stderr));
  CancellableSleeper sleeper;
  auto client = NewMetadataClient(Mode::kConfig);
  auto imds = MakeImdsClient(ImdsOptions{}, clock);
  EngineOptions probe = options;
  probe.mode = Mode::kConfig;
  auto metadata = LoadCloud(probe, *client, *imds, logger, sleeper, Background());
  MetadataSnapshot snapshot;
  std::vector<std::string> extra_errors;
  if (metadata.ok()) {
    snapshot = *std::move(metadata);
  } else {
    extra_errors.push_back("metadata server: " + metadata.status().message());
  }
  auto r = LoadConfig(options, snapshot);
  PrepareHost(r, Mode::kConfig);
  r.errors.insert(r.errors.end(), extra_errors.begin(), extra_errors.end());
  if (json) {
    nlohmann::json j = {{"keys", nlohmann::json::object()}, {"errors", r.errors}, {"warnings", r.warnings}};
    for (auto const& k : AllKeys()) {
      auto const& v = r.values.at(k.name);
      j["keys"][k.name] = {{"value", ShownValue(k, v.value)}, {"source", ConfigSourceName(v.source)}, {"origin", v.origin}};
    }
    std::puts(j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::size_t width = 0;
    for (auto const& k : AllKeys()) width = std::max(width, k.name.size());
    for (auto const& k : AllKeys()) {
      auto const& v = r.values.at(k.name);
      // Multi-line values (env) are shown escaped, one key per line.
      std::string shown = nlohmann::json(ShownValue(k, v.value)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      std::printf("%-*s = %-40s  # %s\n", static_cast<int>(width), k.name.c_str(), shown.c_str(),
                  v.source == ConfigSource::kDefault ? "default" : v.origin.c_str());
    }
    if (!snapshot.available) std::printf("# metadata server not reachable: metadata layers empty\n");
    for (auto const& w : r.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
    for (auto const& e : r.errors) std::fprintf(stderr, "error: %s\n", e.c_str());
  }
  return r.errors.empty() ? 0 : kExitConfigError;
}

}  // namespace spotvisor
