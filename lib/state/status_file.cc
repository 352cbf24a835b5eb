#include "state/status_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace spotvisor {
namespace {

using Json = nlohmann::json;

// How deep status.json nests (3 levels); anything much deeper is not ours,
// and nlohmann's dump() and == recurse once per level.
constexpr int kMaxDepth = 16;

// The deepest nesting of [ and { outside strings; stops counting past limit.
int JsonDepth(std::string_view text, int limit) {
  int depth = 0, max = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      max = std::max(max, ++depth);
      if (max > limit) return max;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max;
}

enum class Kind { kString, kInt, kBool, kObject, kNumber };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kString: return "a string";
    case Kind::kInt: return "a whole number";
    case Kind::kBool: return "true or false";
    case Kind::kObject: return "an object";
    case Kind::kNumber: return "a number";
  }
  return "?";
}

std::string TypeName(const Json& v) {
  if (v.is_number_integer()) return "a whole number";
  if (v.is_number_float()) return "a fraction";
  if (v.is_null()) return "null";
  std::string t = v.type_name();
  return (t == "object" || t == "array" ? "an " : "a ") + t;
}

bool Fits(const Json& v, Kind k, long long lo, long long hi) {
  switch (k) {
    case Kind::kString: return v.is_string();
    case Kind::kBool: return v.is_boolean();
    case Kind::kObject: return v.is_object();
    case Kind::kNumber: return v.is_number();
    case Kind::kInt:
      if (v.is_number_unsigned()) return v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi);
      return v.is_number_integer() && v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi;
  }
  return false;
}

struct Field {
  const char* name;
  Kind kind;
  bool nullable = false;
  long long lo = LLONG_MIN, hi = LLONG_MAX;
};

Status CheckFields(const Json& j, std::initializer_list<Field> fields, const std::string& where) {
  for (auto const& f : fields) {
    auto it = j.find(f.name);
    if (it == j.end() || (f.nullable && it->is_null()) || Fits(*it, f.kind, f.lo, f.hi)) continue;
    std::string range = f.kind == Kind::kInt && f.lo != LLONG_MIN ? fmt::format(" from {} to {}", f.lo, f.hi) : "";
    return FailedPreconditionError(fmt::format("{}: \"{}\" is {}, expected {}{}{}; the file was not written by this spotvisor "
                                               "(or was damaged)",
                                               where, f.name, TypeName(*it), KindName(f.kind), range,
                                               f.nullable ? " or null" : ""));
  }
  return OkStatus();
}

}  // namespace

Status ValidateStatusJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) {
    return FailedPreconditionError(fmt::format("{}: expected a JSON object, got {}", where, TypeName(j)));
  }
  // The fields `spotvisor status`, `sync` and `release` read, with the types
  // the supervisor writes (Supervisor::WriteStatus).
  auto s = CheckFields(j,
                       {{"run_id", Kind::kString},
                        {"mode", Kind::kString},
                        {"phase", Kind::kString},
                        {"since", Kind::kString},
                        {"deadline", Kind::kString},
                        {"reason", Kind::kString},
                        {"bucket", Kind::kString},
                        {"group", Kind::kString},
                        {"spotvisor_pid", Kind::kInt, false, 1, INT_MAX},
                        {"trainer_pid", Kind::kInt, true, 1, INT_MAX},
                        {"exit_code", Kind::kInt, false, INT_MIN, INT_MAX},
                        {"last_event", Kind::kObject},
                        {"last_sync", Kind::kObject, true},
                        {"checkpoint", Kind::kObject},
                        {"transfer", Kind::kObject},
                        // Who wrote the file, so `sync`/`release` never signal a reused pid.
                        {"start_time_ticks", Kind::kInt, false, 0, LLONG_MAX},
                        {"boot_id", Kind::kString}},
                       where);
  if (!s.ok()) return s;
  if (auto e = j.find("last_event"); e != j.end()) {
    s = CheckFields(*e, {{"event", Kind::kString}, {"message", Kind::kString}, {"time", Kind::kString}},
                    where + " last_event");
    if (!s.ok()) return s;
  }
  if (auto c = j.find("checkpoint"); c != j.end()) {
    // Durability (DurabilityTracker::Json), which `spotvisor status` prints.
    s = CheckFields(*c,
                    {{"sequence", Kind::kInt, false, 0, LLONG_MAX},
                     {"files", Kind::kInt, false, 0, INT_MAX},
                     {"bytes", Kind::kInt, false, 0, LLONG_MAX},
                     {"committed_at", Kind::kString, true},
                     {"age_s", Kind::kNumber, true},
                     {"instance", Kind::kString},
                     {"uncommitted_files", Kind::kInt, false, 0, INT_MAX},
                     {"uncommitted_bytes", Kind::kInt, false, 0, LLONG_MAX},
                     {"uncommitted_as_of", Kind::kString},
                     {"caught_up_at", Kind::kString},
                     {"lag_s", Kind::kNumber},
                     {"stalled", Kind::kBool},
                     {"stall_cause", Kind::kString}},
                    where + " checkpoint");
    if (!s.ok()) return s;
  }
  if (auto t = j.find("transfer"); t != j.end()) {
    // A sync or restore in progress (Supervisor::OnTransferProgress).
    s = CheckFields(*t,
                    {{"kind", Kind::kString},
                     {"bytes_done", Kind::kInt, false, 0, LLONG_MAX},
                     {"bytes_total", Kind::kInt, false, 0, LLONG_MAX},
                     {"files", Kind::kInt, false, 0, INT_MAX},
                     {"elapsed_s", Kind::kNumber},
                     {"throughput_mbps", Kind::kNumber, true},
                     {"eta_s", Kind::kNumber, true},
                     {"as_of", Kind::kString}},
                    where + " transfer");
    if (!s.ok()) return s;
  }
  if (auto ls = j.find("last_sync"); ls != j.end() && !ls->is_null()) {
    s = CheckFields(*ls,
                    {{"kind", Kind::kString},
                     {"ok", Kind::kBool},
                     {"deferred", Kind::kBool},
                     {"reason", Kind::kString},
                     {"error", Kind::kString},
                     {"time", Kind::kString},
                     {"sequence", Kind::kInt, false, 0, LLONG_MAX},
                     {"files_uploaded", Kind::kInt, false, 0, INT_MAX},
                     {"bytes", Kind::kInt, false, 0, LLONG_MAX}},
                    where + " last_sync");
    if (!s.ok()) return s;
  }
  return OkStatus();
}

StatusOr<nlohmann::json> ParseStatusJson(std::string_view text, const std::string& where) {
  if (JsonDepth(text, kMaxDepth) > kMaxDepth) {
    return FailedPreconditionError(fmt::format("{}: nested deeper than {} levels; not a status file", where, kMaxDepth));
  }
  auto j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return FailedPreconditionError(where + ": not valid JSON");
  if (auto s = ValidateStatusJson(j, where); !s.ok()) return s;
  return j;
}

std::string StatusFilePath(const std::string& state_dir) { return state_dir + "/status.json"; }

Status WriteFileAtomically(const std::string& path, const std::string& contents, bool durable) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "creating " + tmp);
  std::size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoToStatus(err, "writing " + tmp);
    }
    done += static_cast<std::size_t>(n);
  }
  if ((durable && fsync(fd) != 0) || close(fd) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return ErrnoToStatus(err, "flushing " + tmp);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return ErrnoToStatus(err, "renaming " + tmp + " to " + path);
  }
  return OkStatus();
}

Status WriteStatusFile(const std::string& state_dir, const nlohmann::json& status) {
  // `replace`: a value that is not UTF-8 (a command, an error quoting a file
  // name) is written with U+FFFD instead of throwing in the supervisor.
  return WriteFileAtomically(StatusFilePath(state_dir), status.dump(2, ' ', false, Json::error_handler_t::replace) + "\n",
                             /*durable=*/false);
}

StatusOr<nlohmann::json> ReadStatusFile(const std::string& state_dir) {
  auto path = StatusFilePath(state_dir);
  std::ifstream in(path);
  if (!in) return ErrnoToStatus(errno, path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return ErrnoToStatus(errno, "reading " + path);
  return ParseStatusJson(ss.str(), path);
}

}  // namespace spotvisor
