#include "compute/group.h"

#include <fmt/format.h>

#include "common/strings.h"
#include "output/utf8.h"

namespace spotvisor {
namespace {

// A GCE resource name: [a-z]([-a-z0-9]{0,61}[a-z0-9])?
bool GceName(std::string_view s) {
  if (s.empty() || s.size() > 63 || s.front() < 'a' || s.front() > 'z' || s.back() == '-') return false;
  return s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string_view::npos;
}

// A project number, id or domain-scoped id (example.com:my-project).
bool GceProject(std::string_view s) {
  return !s.empty() && s.size() <= 100 &&
         s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-.:") == std::string_view::npos;
}

std::string Shown(std::string_view s) { return output::EscapeInvalidUtf8(std::string(s.substr(0, 200))); }

}  // namespace

std::string InstanceGroup::Path() const {
  switch (kind) {
    case Kind::kZonalMig: return fmt::format("projects/{}/zones/{}/instanceGroupManagers/{}", project, location, name);
    case Kind::kRegionalMig: return fmt::format("projects/{}/regions/{}/instanceGroupManagers/{}", project, location, name);
    case Kind::kAsg: return name;
  }
  return name;
}

std::string InstanceGroup::KindName() const {
  switch (kind) {
    case Kind::kZonalMig: return "zonal-mig";
    case Kind::kRegionalMig: return "regional-mig";
    case Kind::kAsg: return "asg";
  }
  return "";
}

std::string InstanceGroup::Describe() const {
  switch (kind) {
    case Kind::kZonalMig: return fmt::format("zonal managed instance group {} ({})", name, location);
    case Kind::kRegionalMig: return fmt::format("regional managed instance group {} ({})", name, location);
    case Kind::kAsg:
      return location.empty() ? fmt::format("Auto Scaling group {}", name)
                              : fmt::format("Auto Scaling group {} ({})", name, location);
  }
  return name;
}

StatusOr<InstanceGroup> ParseMigUrl(std::string_view text) {
  std::string_view s = Trim(text);
  for (std::string_view prefix : {"https://www.googleapis.com/compute/v1/", "https://compute.googleapis.com/compute/v1/",
                                  "https://www.googleapis.com/compute/beta/", "https://compute.googleapis.com/compute/beta/"}) {
    if (StartsWith(s, prefix)) {
      s.remove_prefix(prefix.size());
      break;
    }
  }
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError(fmt::format(
        "\"{}\" is not a managed instance group ({}): expected projects/PROJECT/zones/ZONE/instanceGroupManagers/NAME "
        "or projects/PROJECT/regions/REGION/instanceGroupManagers/NAME",
        Shown(text), why));
  };
  auto parts = SplitOn(s, '/');
  if (parts.size() != 6) return bad(fmt::format("{} path segment(s), not 6", parts.size()));
  if (parts[0] != "projects") return bad("it does not begin with projects/");
  if (parts[2] != "zones" && parts[2] != "regions") return bad("the third segment is neither zones nor regions");
  if (parts[4] != "instanceGroupManagers") return bad("the fifth segment is not instanceGroupManagers");
  if (!GceProject(parts[1])) return bad("the project is not a project number or id");
  if (!GceName(parts[3])) return bad(fmt::format("the {} is not a {} name", parts[2] == "zones" ? "zone" : "region",
                                                 parts[2] == "zones" ? "zone" : "region"));
  if (!GceName(parts[5])) return bad("the group's name is not a Compute Engine name");
  InstanceGroup g;
  g.kind = parts[2] == "zones" ? InstanceGroup::Kind::kZonalMig : InstanceGroup::Kind::kRegionalMig;
  g.project = parts[1];
  g.location = parts[3];
  g.name = parts[5];
  return g;
}

StatusOr<InstanceGroup> ParseAsgName(std::string_view text, std::string region) {
  std::string_view s = Trim(text);
  if (s.empty() || s.size() > 255) {
    return InvalidArgumentError(fmt::format("\"{}\" is not an Auto Scaling group name (1 to 255 characters)", Shown(text)));
  }
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      return InvalidArgumentError(
          fmt::format("\"{}\" is not an Auto Scaling group name (it holds a control character)", Shown(text)));
    }
  }
  if (output::EscapeInvalidUtf8(std::string(s)) != s) {
    return InvalidArgumentError(fmt::format("\"{}\" is not an Auto Scaling group name (not UTF-8)", Shown(text)));
  }
  InstanceGroup g;
  g.kind = InstanceGroup::Kind::kAsg;
  g.name = std::string(s);
  g.location = std::move(region);
  return g;
}

}  // namespace spotvisor
