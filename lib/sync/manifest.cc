#include "sync/manifest.h"

#include <set>

#include <fmt/format.h>

#include "common/strings.h"
#include "output/utf8.h"
#include "storage/crc32c.h"

namespace spotvisor {
namespace {

using Json = nlohmann::json;

std::string Escaped(const std::string& s) { return output::EscapeInvalidUtf8(s); }

}  // namespace

std::optional<std::string> GetString(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}
std::optional<std::int64_t> GetInt(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return std::nullopt;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_number_unsigned() && it->get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX)) {
    return static_cast<std::int64_t>(it->get<std::uint64_t>());
  }
  return std::nullopt;
}

bool IsSafeRelativePath(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos) return false;
  std::size_t start = 0;
  while (start <= path.size()) {
    auto end = path.find('/', start);
    auto seg = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (seg.empty() || seg == "." || seg == "..") return false;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return true;
}

// A manifest (or the state file, which has the same "files"), every field
// checked: anything unexpected is an error naming the entry, never a throw.
StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& what, const std::string& checkpoint_dir) {
  auto m = Json::parse(text, nullptr, false);
  if (!m.is_object()) return FailedPreconditionError(fmt::format("{} is not a spotvisor manifest (not a JSON object)", what));
  auto files = m.find("files");
  if (files == m.end() || !files->is_array()) {
    return FailedPreconditionError(fmt::format("{} is not a spotvisor manifest (no \"files\" list)", what));
  }
  Manifest out;
  auto seq = m.contains("sequence") ? GetInt(m, "sequence") : std::optional<std::int64_t>(0);
  if (!seq || *seq < 0) return FailedPreconditionError(fmt::format("{}: \"sequence\" is not a non-negative integer", what));
  out.sequence = *seq;
  out.commit_id = GetString(m, "commit_id").value_or("");
  out.instance = Escaped(GetString(m, "instance").value_or("?"));
  out.committed_at = Escaped(GetString(m, "committed_at").value_or("?"));
  auto marker = m.find("marker");
  out.marker = marker != m.end() && marker->is_boolean() && marker->get<bool>();
  std::set<std::string> seen;
  for (auto const& f : *files) {
    if (!f.is_object()) return FailedPreconditionError(fmt::format("{}: a \"files\" entry is not an object", what));
    ManifestEntry e;
    auto path = GetString(f, "path");
    auto object = GetString(f, "object");
    auto crc_text = GetString(f, "crc32c");
    auto size = GetInt(f, "size");
    auto gen = f.contains("generation") ? GetInt(f, "generation") : std::optional<std::int64_t>(0);
    std::string name = path ? Escaped(*path) : std::string("?");
    if (!path || !object || !crc_text || !size || *size < 0 || !gen) {
      return FailedPreconditionError(fmt::format("{}: the entry for \"{}\" is malformed", what, name));
    }
    e.path = *path;
    e.object = *object;
    e.size = static_cast<std::uint64_t>(*size);
    e.generation = *gen;
    e.mtime_ns = GetInt(f, "mtime_ns").value_or(0);
    if (!IsSafeRelativePath(e.path) || e.path.find(kRestoreTmp) != std::string::npos || e.path == kCompleteMarker ||
        StartsWith(e.path, std::string(kStagingDir) + "/")) {
      return PermissionDeniedError(
          fmt::format("{} names \"{}\", which would escape {}: refusing to restore", what, name, Escaped(checkpoint_dir)));
    }
    auto crc = Crc32cFromBase64(*crc_text);
    if (!crc.ok() || e.object.rfind(kObjectsDir, 0) != 0 || !seen.insert(e.path).second) {
      return FailedPreconditionError(fmt::format("{}: the entry for \"{}\" is malformed", what, name));
    }
    e.crc = *crc;
    out.files.push_back(std::move(e));
  }
  return out;
}

ObjectDescription DescribeRunObject(const std::string& name) {
  ObjectDescription d;
  if (name == kManifestObject || name == kDoneObject || name == kRunStatus) {
    d.content_type = "application/json";
    return d;
  }
  std::string_view objects = kObjectsDir;
  if (name.compare(0, objects.size(), objects) != 0) return d;
  d.content_type = "application/octet-stream";
  auto rest = std::string_view(name).substr(objects.size());
  auto tilde = rest.rfind('~');
  if (tilde == std::string_view::npos) return d;
  d.metadata["spotvisor-path"] = std::string(rest.substr(0, tilde));
  auto seq = rest.substr(tilde + 1);
  d.metadata["spotvisor-sequence"] = std::string(seq.substr(0, seq.find('.')));
  return d;
}

}  // namespace spotvisor
