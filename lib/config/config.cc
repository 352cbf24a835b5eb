#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/duration.h"
#include "common/strings.h"
#include "config/keys.h"
#include "mount/mounter.h"
#include "output/utf8.h"
#include "storage/object_store.h"

namespace spotvisor {
namespace {

// [A-Za-z0-9][A-Za-z0-9._-]{0,127}, checked by hand: std::regex
// backtracks through the 127 optional characters and recurses per byte.
bool ValidRunId(const std::string& id) {
  auto ok_char = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-'; };
  return !id.empty() && id.size() <= 128 && std::isalnum(static_cast<unsigned char>(id[0])) &&
         std::all_of(id.begin(), id.end(), ok_char);
}

constexpr char kAfterDashDash[] = "command line (after --)";

// Values quoted in error messages: readable whatever their bytes, and not
// all of a value that is a megabyte long.
std::string Shown(std::string_view v) {
  constexpr std::size_t kMax = 200;
  if (v.size() <= kMax) return output::EscapeInvalidUtf8(v);
  return output::EscapeInvalidUtf8(v.substr(0, output::Utf8SafePrefixLength(v, kMax))) +
         fmt::format("...({} bytes)", v.size());
}

bool IsEnvName(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

std::string DidYouMean(const std::string& key) {
  auto m = ClosestMatch(key, AllKeyNames());
  return m.empty() ? std::string() : fmt::format(" (did you mean {}?)", m);
}

// Collects values layer by layer, later layers winning.
class Layers {
 public:
  explicit Layers(ConfigResult& r) : r_(r) {}

  void Set(const std::string& key, std::string value, ConfigSource source, std::string origin) {
    r_.values[key] = ConfigValue{std::move(value), source, std::move(origin)};
  }

  void AddMetadata(const std::map<std::string, std::string>& attrs, ConfigSource source, const char* what) {
    for (auto const& [name, value] : attrs) {
      if (!StartsWith(name, kMetadataPrefix)) continue;  // ssh-keys, startup-script, ...
      auto key = name.substr(std::string_view(kMetadataPrefix).size());
      if (FindKey(key) == nullptr) {
        auto hint = ClosestMatch(key, AllKeyNames());
        r_.warnings.push_back(fmt::format("{} {}: unknown spotvisor attribute, ignored{}", what, name,
                                          hint.empty() ? "" : fmt::format(" (did you mean {}{}?)", kMetadataPrefix, hint)));
        continue;
      }
      Set(key, value, source, fmt::format("{} {}", what, name));
    }
  }

 private:
  ConfigResult& r_;
};

class Resolver {
 public:
  explicit Resolver(ConfigResult& r) : r_(r) {}

  const ConfigValue& Get(const std::string& key) { return r_.values.at(key); }

  void Error(const std::string& key, const std::string& problem) {
    r_.errors.push_back(fmt::format("{}: {}", Get(key).origin, problem));
  }

  std::chrono::milliseconds Duration(const std::string& key, std::chrono::milliseconds fallback) {
    auto d = ParseDuration(Trim(Get(key).value));
    if (!d.ok()) {
      Error(key, d.status().message());
      return fallback;
    }
    return *d;
  }

  void Command(Config& c, const std::vector<std::string>& cli_command) {
    auto const& v = Get("command");
    auto text = Trim(v.value);
    c.command = std::string(text);
    if (v.source == ConfigSource::kCommandLine && !cli_command.empty() && v.origin == kAfterDashDash) {
      // The words after -- are exec'ed as given, byte for byte: an argument
      // need not be UTF-8 (a file name is bytes), so it is not round-tripped
      // through JSON, which only holds text.
      c.exec_form = true;
      c.argv = cli_command;
      if (c.argv[0].empty()) Error("command", "the program name (first element) is empty");
      return;
    }
    if (text.empty()) {
      r_.errors.push_back(
          "command: no command to run; set the spotvisor-command instance metadata attribute "
          "(or `command` in the config file, or give one after --)");
      return;
    }
    if (text.front() != '[') {
      c.argv = {"/bin/sh", "-c", std::string(text)};
      return;
    }
    c.exec_form = true;
    auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!json.is_array() || json.empty() ||
        !std::all_of(json.begin(), json.end(), [](auto const& e) { return e.is_string(); })) {
      Error("command", fmt::format("\"{}\" is not a JSON array of strings (exec form, like [\"python\", \"train.py\"]); "
                                   "without the leading [ it would run through /bin/sh -c",
                                   Shown(text)));
      return;
    }
    for (auto const& e : json) c.argv.push_back(e.get<std::string>());
    if (c.argv[0].empty()) Error("command", "the program name (first element) is empty");
  }

  // gcloud's --metadata separates pairs with commas, so `env` and
  // `log-labels` set there often arrive as "A=1,B=2" on one line: taken as
  // one value, without a word (issue #32). Said once per key.
  void WarnIfCommaJoined(const std::string& key, std::string_view line) {
    for (std::size_t comma = line.find(','); comma != std::string_view::npos; comma = line.find(',', comma + 1)) {
      auto rest = line.substr(comma + 1);
      auto eq = rest.find('=');
      if (eq != std::string_view::npos && eq > 0 && IsEnvName(Trim(rest.substr(0, eq)))) {
        r_.warnings.push_back(fmt::format(
            "{}: \"{}\" looks like several NAME=value pairs joined by commas; they are one value here ({} takes one "
            "pair per line). Put each on its own line (in a file: {} = \"A=1\\nB=2\"; with gcloud: "
            "--metadata-from-file, or --metadata=^;^KEY=... to change gcloud's separator)",
            Get(key).origin, Shown(line), key, key));
        return;
      }
    }
  }

  void Env(Config& c) {
    int n = 0;
    for (auto const& raw : SplitLines(Get("env").value)) {
      ++n;
      auto line = Trim(raw);
      if (line.empty() || line.front() == '#') continue;
      auto eq = line.find('=');
      if (eq == std::string_view::npos || !IsEnvName(line.substr(0, eq))) {
        Error("env", fmt::format("line {} \"{}\" is not NAME=value (one per line, NAME of letters, digits and _)", n, line));
        continue;
      }
      WarnIfCommaJoined("env", line);
      c.env.emplace_back(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
    }
  }

  // ${NAME} in exec form is expanded by us from `env` and spotvisor's own
  // variables; in shell form the shell expands it from the same environment
  // (and quotes it properly), so we leave it alone.
  void ExpandExecForm(Config& c) {
    if (!c.exec_form) return;
    std::map<std::string, std::string> vars(c.env.begin(), c.env.end());
    for (auto const& [k, v] : SpotvisorEnv(c)) vars[k] = v;
    // A scan, not std::regex: libstdc++'s regex recurses once per character
    // and overflows the stack on a long argument.
    auto name_char = [](char ch, bool first) {
      return std::isalpha(static_cast<unsigned char>(ch)) || ch == '_' || (!first && std::isdigit(static_cast<unsigned char>(ch)));
    };
    for (auto& arg : c.argv) {
      std::string out;
      std::size_t i = 0;
      while (i < arg.size()) {
        auto ref = arg.find("${", i);
        if (ref == std::string::npos) break;
        std::size_t j = ref + 2;
        while (j < arg.size() && name_char(arg[j], j == ref + 2)) ++j;
        if (j == ref + 2 || j >= arg.size() || arg[j] != '}') {
          // Not a ${NAME} reference: copied as it is.
          out.append(arg, i, ref + 2 - i);
          i = ref + 2;
          continue;
        }
        out.append(arg, i, ref - i);
        std::string name = arg.substr(ref + 2, j - ref - 2);
        auto found = vars.find(name);
        if (found == vars.end()) {
          Error("command", fmt::format("${{{}}} is not defined in env (exec form expands only env and SPOTVISOR_* variables)",
                                       Shown(name)));
          out.append(arg, ref, j + 1 - ref);
        } else {
          out += found->second;
        }
        i = j + 1;
      }
      out.append(arg, i, std::string::npos);
      arg = std::move(out);
    }
  }

  void Path(const std::string& key, std::string& out, bool may_be_empty) {
    out = std::string(Trim(Get(key).value));
    if (out.empty() && may_be_empty) return;
    if (out.empty() || out.front() != '/') {
      Error(key, fmt::format("\"{}\" is not an absolute path", Shown(out)));
    }
  }

  void RunId(Config& c) {
    c.run_id = std::string(Trim(Get("run-id").value));
    if (!ValidRunId(c.run_id)) {
      Error("run-id", fmt::format("\"{}\" is not a valid run id (1-128 of A-Z a-z 0-9 . _ -, starting with a letter or digit)", Shown(c.run_id)));
    }
  }

  void Integer(const std::string& key, int lo, int hi, int& out) {
    auto v = std::string(Trim(Get(key).value));
    char* end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < lo || n > hi) {
      Error(key, fmt::format("\"{}\" is not a whole number from {} to {}", Shown(v), lo, hi));
      return;
    }
    out = static_cast<int>(n);
  }

  // A size in bytes: digits with an optional K, M, G or T (powers of 1024,
  // as gsutil's "150M"; "KiB", "MiB", ... also accepted).
  void ByteSize(const std::string& key, std::uint64_t& out) {
    auto v = std::string(Trim(Get(key).value));
    std::size_t digits = 0;
    while (digits < v.size() && v[digits] >= '0' && v[digits] <= '9') ++digits;
    auto n = ParseUint64(std::string_view(v).substr(0, digits));
    std::string unit = v.substr(digits);
    int shift = -1;
    for (auto [u, sh] : {std::pair{"", 0}, {"K", 10}, {"KiB", 10}, {"M", 20}, {"MiB", 20}, {"G", 30}, {"GiB", 30},
                         {"T", 40}, {"TiB", 40}}) {
      if (unit == u) shift = sh;
    }
    if (!n || shift < 0 || *n > (std::numeric_limits<std::uint64_t>::max() >> shift)) {
      Error(key, fmt::format("\"{}\" is not a size (a whole number with an optional K, M, G or T, e.g. 64M)", Shown(v)));
      return;
    }
    out = *n << shift;
  }

  // A key whose value is one of a fixed set of words.
  template <typename T>
  void OneOf(const std::string& key, std::initializer_list<std::pair<const char*, T>> choices, T& out) {
    auto v = Trim(Get(key).value);
    std::string names;
    for (auto const& [name, value] : choices) {
      if (v == name) {
        out = value;
        return;
      }
      names += (names.empty() ? "" : ", ") + std::string(name);
    }
    Error(key, fmt::format("\"{}\" is not one of: {}", Shown(v), names));
  }

 private:
  ConfigResult& r_;
};

}  // namespace

const char* OnExitName(OnExit o) {
  switch (o) {
    case OnExit::kPoweroff: return "poweroff";
    case OnExit::kNone: return "none";
    case OnExit::kStop: return "stop";
    case OnExit::kDelete: return "delete";
  }
  return "?";
}

const char* ConfigSourceName(ConfigSource s) {
  switch (s) {
    case ConfigSource::kDefault: return "default";
    case ConfigSource::kFile: return "file";
    case ConfigSource::kProjectMetadata: return "project metadata";
    case ConfigSource::kInstanceMetadata: return "instance metadata";
    case ConfigSource::kCommandLine: return "command line";
  }
  return "?";
}

ConfigResult ResolveConfig(const ConfigInputs& in) {
  ConfigResult r;
  Layers layers(r);
  for (auto const& k : AllKeys()) {
    auto dyn = in.dynamic_defaults.find(k.name);
    layers.Set(k.name, dyn != in.dynamic_defaults.end() ? dyn->second : k.default_value,
               ConfigSource::kDefault, "default " + k.name);
  }
  std::map<std::string, int> first_line;  // a key given twice in the file: an error, not the last one silently
  for (auto const& e : in.file_entries) {
    if (auto [it, fresh] = first_line.emplace(e.key, e.line); !fresh && FindKey(e.key) != nullptr) {
      r.errors.push_back(fmt::format(
          "{}:{} {}: given again (first on line {}); a key takes one value{}", in.file_path, e.line, e.key, it->second,
          e.key == "env" || e.key == "log-labels"
              ? fmt::format(": several on one key, one per line, as a quoted value: {} = \"A=1\\nB=2\"", e.key)
              : ""));
      continue;
    }
    if (FindKey(e.key) == nullptr) {
      r.warnings.push_back(fmt::format("{}:{}: unknown key \"{}\", ignored{}", in.file_path, e.line, e.key, DidYouMean(e.key)));
      continue;
    }
    layers.Set(e.key, e.value, ConfigSource::kFile, fmt::format("{}:{} {}", in.file_path, e.line, e.key));
  }
  layers.AddMetadata(in.project_attributes, ConfigSource::kProjectMetadata, in.project_layer.c_str());
  layers.AddMetadata(in.instance_attributes, ConfigSource::kInstanceMetadata, in.instance_layer.c_str());
  for (auto const& [key, value] : in.cli_sets) {
    if (FindKey(key) == nullptr) {
      r.errors.push_back(fmt::format("--set {}: unknown key{}", key, DidYouMean(key)));
      continue;
    }
    layers.Set(key, value, ConfigSource::kCommandLine, "--set " + key);
  }
  if (!in.cli_command.empty()) {
    // For display (`spotvisor config`, logs) only: Command() execs
    // in.cli_command itself. `replace`: an argument that is not UTF-8 must
    // not throw here.
    layers.Set("command", nlohmann::json(in.cli_command).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
               ConfigSource::kCommandLine, kAfterDashDash);
  }

  Config c;
  Resolver res(r);
  res.Command(c, in.cli_command);
  res.Env(c);
  c.user = std::string(Trim(res.Get("user").value));
  if (c.user.empty()) r.errors.push_back(res.Get("user").origin + ": the user name is empty");
  res.Path("workdir", c.workdir, /*may_be_empty=*/true);
  res.Path("checkpoint-dir", c.checkpoint_dir, false);
  res.Path("state-dir", c.state_dir, false);
  res.RunId(c);
  c.stop_timeout = res.Duration("stop-timeout", c.stop_timeout);
  c.kill_timeout = res.Duration("kill-timeout", c.kill_timeout);
  c.progress_interval = res.Duration("progress-interval", c.progress_interval);
  c.metadata_watch_timeout = res.Duration("metadata-watch-timeout", c.metadata_watch_timeout);
  if (c.metadata_watch_timeout < std::chrono::seconds(1)) {
    res.Error("metadata-watch-timeout", "must be at least 1s (the metadata server counts whole seconds)");
  }
  const std::initializer_list<std::pair<const char*, OnExit>> kOnExit = {
      {"poweroff", OnExit::kPoweroff}, {"stop", OnExit::kStop}, {"delete", OnExit::kDelete}, {"none", OnExit::kNone}};
  res.OneOf<OnExit>("on-exit", kOnExit, c.on_exit);
  for (auto [key, out] : {std::pair{"on-exit-success", &c.on_exit_success}, std::pair{"on-exit-failure", &c.on_exit_failure}}) {
    if (Trim(res.Get(key).value).empty()) continue;
    OnExit v = c.on_exit;
    res.OneOf<OnExit>(key, kOnExit, v);
    *out = v;
  }
  c.compute_endpoint = std::string(Trim(res.Get("compute-endpoint").value));
  while (!c.compute_endpoint.empty() && c.compute_endpoint.back() == '/') c.compute_endpoint.pop_back();
  res.OneOf<LogFormat>("log-format", {{"auto", LogFormat::kAuto}, {"json", LogFormat::kJson}, {"text", LogFormat::kText}},
                       c.log_format);
  c.shutdown_command = std::string(Trim(res.Get("shutdown-command").value));
  if (c.shutdown_command.empty()) {
    // stop and delete fall back to it when the Compute API call fails.
    res.Error("shutdown-command", "is empty; on-exit needs it to power off");
  }
  res.OneOf<std::string>("cloud", {{"auto", "auto"}, {"gce", "gce"}, {"aws", "aws"}}, c.cloud);
  res.OneOf<LogTo>("log-to",
                   {{"auto", LogTo::kAuto}, {"stdout", LogTo::kStdout}, {"api", LogTo::kApi}, {"journald", LogTo::kJournald}},
                   c.log_to);
  c.logging_endpoint = std::string(Trim(res.Get("logging-endpoint").value));
  while (!c.logging_endpoint.empty() && c.logging_endpoint.back() == '/') c.logging_endpoint.pop_back();
  c.log_group = std::string(Trim(res.Get("log-group").value));
  if (!ValidLogGroupName(c.log_group)) {
    res.Error("log-group", fmt::format("\"{}\" is not a CloudWatch Logs group name (1 to 512 of A-Z a-z 0-9 _ - / . #)",
                                       Shown(c.log_group)));
  }
  for (auto const& raw : SplitLines(res.Get("log-labels").value)) {
    auto line = Trim(raw);
    if (line.empty() || line.front() == '#') continue;
    auto eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      res.Error("log-labels", fmt::format("\"{}\" is not NAME=value", Shown(line)));
      continue;
    }
    res.WarnIfCommaJoined("log-labels", line);
    c.log_labels[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  c.bucket = std::string(Trim(res.Get("bucket").value));
  if (!c.bucket.empty()) {
    auto loc = ParseStoreLocation(c.bucket);
    if (!loc.ok()) {
      res.Error("bucket", loc.status().message());
    } else if (loc->scheme == "file" && !c.checkpoint_dir.empty() &&
               PathIsUnder(std::filesystem::path(loc->prefix).lexically_normal().string(),
                           std::filesystem::path(c.checkpoint_dir).lexically_normal().string())) {
      // Each sync would upload the previous syncs' objects again, into itself.
      res.Error("bucket", fmt::format("\"{}\" is inside checkpoint-dir {}: the store would be synced into itself; keep "
                                      "the file:// store outside checkpoint-dir",
                                      Shown(c.bucket), Shown(c.checkpoint_dir)));
    }
  }
  c.sync_interval = res.Duration("sync-interval", c.sync_interval);
  c.sync_settle = res.Duration("sync-settle", c.sync_settle);
  c.run_claim_ttl = res.Duration("run-claim-ttl", c.run_claim_ttl);
  if (c.run_claim_ttl < std::chrono::minutes(1) || c.run_claim_ttl > std::chrono::hours(24) ||
      c.run_claim_ttl.count() % 1000 != 0) {
    res.Error("run-claim-ttl", "must be whole seconds from 1m to 24h");
  }
  if (Trim(res.Get("sync-alert-after").value).empty()) {
    c.sync_alert_after = 3 * c.sync_interval;
  } else {
    c.sync_alert_after = res.Duration("sync-alert-after", c.sync_alert_after);
    if (c.sync_alert_after.count() > 0 && c.sync_alert_after <= c.sync_interval) {
      res.Error("sync-alert-after",
                fmt::format("{} is not longer than sync-interval ({}): every wait for the next periodic sync would count "
                            "as a stall; make it at least twice sync-interval, or 0 to switch the alert off",
                            FormatDuration(c.sync_alert_after), FormatDuration(c.sync_interval)));
    }
  }
  res.OneOf<bool>("sync-stall-action", {{"warn", false}, {"stop", true}}, c.sync_stall_stop);
  if (c.sync_stall_stop && c.sync_alert_after.count() == 0 && !c.bucket.empty()) {
    res.Error("sync-stall-action", "stop needs sync-alert-after (it is 0, so a stall is never detected)");
  }
  c.checkpoint_report_interval = res.Duration("checkpoint-report-interval", c.checkpoint_report_interval);
  res.Integer("sync-parallelism", 1, 64, c.sync_parallelism);
  res.ByteSize("sync-parallel-min-size", c.sync_parallel_min_size);
  res.OneOf<bool>("restart", {{"never", false}, {"on-failure", true}}, c.restart_on_failure);
  res.Integer("max-restarts", 0, 1000, c.max_restarts);
  res.Integer("max-failed-boots", 0, 1000, c.max_failed_boots);
  res.OneOf<bool>("group-delete-when-empty", {{"false", false}, {"true", true}}, c.group_delete_when_empty);
  c.stop_check_interval = res.Duration("stop-check-interval", c.stop_check_interval);
  c.group = std::string(Trim(res.Get("group").value));
  if (c.group.empty()) c.group = "auto";
  c.restart_delay = res.Duration("restart-delay", c.restart_delay);
  c.max_runtime = res.Duration("max-runtime", c.max_runtime);
  c.maintenance_stop_lead = res.Duration("maintenance-stop-lead", c.maintenance_stop_lead);
  c.maintenance_stop_before = res.Duration("maintenance-stop-before", c.maintenance_stop_before);
  c.preemption_notice = res.Duration("preemption-notice", c.preemption_notice);
  c.preemption_stop_lead = res.Duration("preemption-stop-lead", c.preemption_stop_lead);
  if (c.preemption_notice.count() > 0 && c.preemption_stop_lead > c.preemption_notice) {
    res.Error("preemption-stop-lead",
              fmt::format("{} is longer than preemption-notice ({}): the power button would come before the trainer is "
                          "asked to stop",
                          FormatDuration(c.preemption_stop_lead), FormatDuration(c.preemption_notice)));
  }
  c.preemption_window = res.Duration("preemption-window", c.preemption_window);
  c.on_exit_timeout = res.Duration("on-exit-timeout", c.on_exit_timeout);
  if (c.on_exit_timeout < std::chrono::seconds(4)) res.Error("on-exit-timeout", "must be at least 4s");
  c.on_failure_hold = res.Duration("on-failure-hold", c.on_failure_hold);
  c.idle_timeout = res.Duration("idle-timeout", c.idle_timeout);
  res.Integer("idle-threshold", 1, 100, c.idle_threshold);
  c.storage_endpoint = std::string(Trim(res.Get("storage-endpoint").value));
  if (!StartsWith(c.storage_endpoint, "http://") && !StartsWith(c.storage_endpoint, "https://")) {
    res.Error("storage-endpoint", fmt::format("\"{}\" is not an http:// or https:// URL", c.storage_endpoint));
  }
  while (!c.storage_endpoint.empty() && c.storage_endpoint.back() == '/') c.storage_endpoint.pop_back();
  // Mounts.
  c.dataset_disk = std::string(Trim(res.Get("dataset-disk").value));
  c.scratch_disk = std::string(Trim(res.Get("scratch-disk").value));
  for (auto [key, disk] : {std::pair{"dataset-disk", &c.dataset_disk}, std::pair{"scratch-disk", &c.scratch_disk}}) {
    if (!disk->empty() && !StartsWith(*disk, "/dev/") && disk->find_first_of("/ \t") != std::string::npos) {
      res.Error(key, fmt::format("\"{}\" is not a device name (as in device-name=NAME) or a /dev/... path", *disk));
    }
  }
  res.Path("dataset-dir", c.dataset_dir, false);
  res.Path("scratch-dir", c.scratch_dir, false);
  res.Path("bucket-mount", c.bucket_mount, true);
  c.dataset_mount_options = std::string(Trim(res.Get("dataset-mount-options").value));
  if (auto f = ParseMountOptions(c.dataset_mount_options); !f.ok()) {
    res.Error("dataset-mount-options", f.status().message());
  } else {
    for (auto const& o : SplitOn(c.dataset_mount_options, ',')) {
      if (o == "rw") res.Error("dataset-mount-options", "the dataset disk is always mounted read-only: drop \"rw\"");
    }
  }
  res.OneOf<std::string>("mount-driver", {{"gcsfuse", "gcsfuse"}, {"rclone", "rclone"}}, c.mount_driver);
  for (auto const& w : SplitOn(std::string(Trim(res.Get("mount-options").value)), ' ')) {
    if (w.empty()) continue;
    // The driver must stay spotvisor's child: a daemonized one escapes
    // supervision (and the unmount's wait for its last uploads).
    if (w == "--daemon" || StartsWith(w, "--daemon=") || StartsWith(w, "--foreground=")) {
      res.Error("mount-options", fmt::format("\"{}\": spotvisor runs the mount driver in the foreground, as its child", w));
    }
    c.mount_options.push_back(w);
  }
  c.mount_timeout = res.Duration("mount-timeout", c.mount_timeout);
  res.OneOf<bool>("sync-via", {{"api", false}, {"mount", true}}, c.sync_via_mount);
  if (!c.bucket_mount.empty() && !StartsWith(c.bucket, "gs://")) {
    res.Error("bucket-mount", c.bucket.empty() ? "needs bucket = gs://BUCKET[/PREFIX]: which bucket to mount"
                                               : fmt::format("needs a gs:// bucket, not \"{}\"", c.bucket));
  }
  if (c.sync_via_mount && c.bucket_mount.empty()) {
    res.Error("sync-via", "mount needs bucket-mount (the directory the bucket is mounted on)");
  }
  if (PathIsUnder(c.checkpoint_dir, c.bucket_mount)) {
    res.Error("checkpoint-dir", fmt::format("\"{}\" is inside bucket-mount {}: keep checkpoints on a local disk (they are "
                                            "synced to the bucket)",
                                            c.checkpoint_dir, c.bucket_mount));
  }
  // Gang training (issue #16, docs/gang.md).
  c.gang = std::string(Trim(res.Get("gang").value));
  if (!c.gang.empty()) {
    auto ok_char = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-'; };
    if (c.gang.size() > 128 || !std::isalnum(static_cast<unsigned char>(c.gang[0])) ||
        !std::all_of(c.gang.begin(), c.gang.end(), ok_char)) {
      res.Error("gang", fmt::format("\"{}\" is not a gang name (1-128 of A-Z a-z 0-9 . _ -, starting with a letter or digit: "
                                    "it is also the run-id)",
                                    Shown(c.gang)));
    }
    // The whole gang is one run: the same run-id on every member.
    if (res.Get("run-id").source == ConfigSource::kDefault) c.run_id = c.gang;
    res.Integer("gang-size", 2, 1024, c.gang_size);
    for (auto const& w : SplitOn(std::string(Trim(res.Get("gang-etcd").value)), ' ')) {
      for (auto const& e : SplitOn(w, ',')) {
        auto ep = std::string(Trim(e));
        if (ep.empty()) continue;
        if (!StartsWith(ep, "http://") && !StartsWith(ep, "https://")) {
          res.Error("gang-etcd", fmt::format("\"{}\" is not an http:// or https:// URL", Shown(ep)));
          continue;
        }
        while (ep.back() == '/') ep.pop_back();
        c.gang_etcd.push_back(ep);
      }
    }
    if (c.gang_etcd.empty()) res.Error("gang-etcd", "gang needs the etcd endpoints it coordinates through");
    c.gang_etcd_ca = std::string(Trim(res.Get("gang-etcd-ca").value));
    c.gang_etcd_cert = std::string(Trim(res.Get("gang-etcd-cert").value));
    c.gang_etcd_key = std::string(Trim(res.Get("gang-etcd-key").value));
    if (c.gang_etcd_cert.empty() != c.gang_etcd_key.empty()) {
      res.Error(c.gang_etcd_cert.empty() ? "gang-etcd-key" : "gang-etcd-cert",
                "gang-etcd-cert and gang-etcd-key go together (the client certificate and its key)");
    }
    c.gang_etcd_user = std::string(Trim(res.Get("gang-etcd-user").value));
    c.gang_etcd_password = res.Get("gang-etcd-password").value;  // as given: spaces may belong to it
    if (c.gang_etcd_user.empty() != c.gang_etcd_password.empty()) {
      res.Error(c.gang_etcd_user.empty() ? "gang-etcd-password" : "gang-etcd-user",
                "gang-etcd-user and gang-etcd-password go together");
    }
    res.OneOf<bool>("gang-launch", {{"each", false}, {"leader", true}}, c.gang_launch_leader);
    res.Integer("gang-ssh-port", 1, 65535, c.gang_ssh_port);
    c.gang_ssh_authorized_keys = std::string(Trim(res.Get("gang-ssh-authorized-keys").value));
    if (!c.gang_ssh_authorized_keys.empty() &&
        (c.gang_ssh_authorized_keys.front() != '/' || std::string_view(c.gang_ssh_authorized_keys).substr(c.gang_ssh_authorized_keys.size() >= 21 ? c.gang_ssh_authorized_keys.size() - 21 : 0) != "/.ssh/authorized_keys" ||
         c.gang_ssh_authorized_keys.size() <= std::string_view("/.ssh/authorized_keys").size())) {
      res.Error("gang-ssh-authorized-keys",
                fmt::format("\"{}\" is not an absolute path ending in /.ssh/authorized_keys (spotvisor edits it as it "
                            "edits a user's own: DIR/.ssh made 0700 and owned by the trainer user)",
                            Shown(c.gang_ssh_authorized_keys)));
    }
    res.OneOf<bool>("gang-on-loss", {{"stop", false}, {"wait", true}}, c.gang_wait_on_loss);
    c.gang_reform_timeout = res.Duration("gang-reform-timeout", c.gang_reform_timeout);
    if (c.gang_reform_timeout < std::chrono::seconds(1)) res.Error("gang-reform-timeout", "must be at least 1s");
    res.OneOf<bool>("gang-checkpoint", {{"leader", false}, {"all", true}}, c.gang_checkpoint_all);
    c.gang_form_timeout = res.Duration("gang-form-timeout", c.gang_form_timeout);
    if (c.gang_form_timeout < std::chrono::seconds(1)) res.Error("gang-form-timeout", "must be at least 1s");
    c.gang_lease_ttl = res.Duration("gang-lease-ttl", c.gang_lease_ttl);
    if (c.gang_lease_ttl < std::chrono::seconds(2) || c.gang_lease_ttl > std::chrono::minutes(5) ||
        c.gang_lease_ttl.count() % 1000 != 0) {
      res.Error("gang-lease-ttl", "must be whole seconds from 2s to 5m (etcd counts lease TTLs in seconds)");
    }
    c.gang_address = std::string(Trim(res.Get("gang-address").value));
    if (c.gang_address.find_first_of(" \t,/") != std::string::npos) {
      res.Error("gang-address", fmt::format("\"{}\" is not an address", Shown(c.gang_address)));
    }
    res.Integer("gang-master-port", 1, 65535, c.gang_master_port);
    if (c.restart_on_failure && !c.gang_wait_on_loss) {
      res.Error("restart", "on-failure in a gang needs gang-on-loss = wait: a failed trainer ends the generation for "
                           "every member, and the others must wait while this one restarts");
    }
  }
  // status.json is written from the start, before anything is mounted.
  for (auto [dir, used] : {std::pair{&c.dataset_dir, !c.dataset_disk.empty()}, std::pair{&c.scratch_dir, !c.scratch_disk.empty()},
                           std::pair{&c.bucket_mount, !c.bucket_mount.empty()}}) {
    if (used && PathIsUnder(c.state_dir, *dir)) {
      res.Error("state-dir", fmt::format("\"{}\" is on {}, which is mounted only after spotvisor starts writing its status there",
                                         c.state_dir, *dir));
    }
  }
  if (r.errors.empty()) res.ExpandExecForm(c);
  if (r.errors.empty()) r.config = std::move(c);
  return r;
}

StatusOr<std::pair<std::string, std::string>> ParseSetFlag(const std::string& arg) {
  auto eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgumentError(fmt::format("--set {}: expected KEY=VALUE", arg));
  }
  return std::make_pair(arg.substr(0, eq), arg.substr(eq + 1));
}

std::vector<std::pair<std::string, std::string>> SpotvisorEnv(const Config& c) {
  std::vector<std::pair<std::string, std::string>> env = {
      {"SPOTVISOR_RUN_ID", c.run_id},
      {"SPOTVISOR_CHECKPOINT_DIR", c.checkpoint_dir},
      // Vertex AI's name for the same thing, so trainers written for it work.
      {"AIP_CHECKPOINT_DIR", c.checkpoint_dir},
      // Touch it after each complete save (docs/checkpoints.md).
      {"SPOTVISOR_CHECKPOINT_MARKER", c.checkpoint_dir + "/.spotvisor-complete"},
  };
  // What the bucket holds (docs/checkpoints.md, examples/committed.py).
  if (!c.bucket.empty()) env.emplace_back("SPOTVISOR_COMMITTED_FILE", CommittedFilePath(c.state_dir));
  if (!c.dataset_disk.empty()) env.emplace_back("SPOTVISOR_DATASET_DIR", c.dataset_dir);
  if (!c.scratch_disk.empty()) env.emplace_back("SPOTVISOR_SCRATCH_DIR", c.scratch_dir);
  if (!c.bucket_mount.empty()) env.emplace_back("SPOTVISOR_OUTPUT_DIR", c.bucket_mount);
  return env;
}

bool ValidLogGroupName(std::string_view name) {
  if (name.empty() || name.size() > 512) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '/' || c == '.' || c == '#';
    if (!ok) return false;
  }
  return true;
}

std::string RunIdOf(const ConfigResult& r) {
  auto get = [&](const char* key) -> const ConfigValue* {
    auto it = r.values.find(key);
    return it == r.values.end() ? nullptr : &it->second;
  };
  std::string id;
  if (auto v = get("run-id")) id = std::string(Trim(v->value));
  auto gang = get("gang");
  if (gang && !Trim(gang->value).empty() && (!get("run-id") || get("run-id")->source == ConfigSource::kDefault)) {
    id = std::string(Trim(gang->value));
  }
  return ValidRunId(id) ? id : "";
}

}  // namespace spotvisor
