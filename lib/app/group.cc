#include "app/group.h"

#include <fmt/format.h>

#include "common/strings.h"
#include "output/utf8.h"

namespace spotvisor {

StatusOr<GroupResolution> ResolveGroup(std::string_view key, const MetadataSnapshot& m) {
  GroupResolution out;
  std::string_view v = Trim(key);
  if (v.empty()) v = "auto";
  if (v == "none") return out;
  const bool gce = m.available && m.cloud == "gce";
  const bool aws = m.available && m.cloud == "aws";
  if (v == "auto") {
    if (gce) {
      auto it = m.instance_attributes.find("created-by");
      if (it == m.instance_attributes.end()) return out;
      auto g = ParseMigUrl(it->second);
      if (!g.ok()) {
        return InvalidArgumentError(fmt::format(
            "group: the instance attribute created-by says {}; set spotvisor-group to the group's URL, or to none if "
            "this VM is in no managed instance group",
            g.status().message()));
      }
      g->source = "created-by";
      out.group = *std::move(g);
    } else if (aws) {
      if (m.asg_name) {
        auto g = ParseAsgName(*m.asg_name, m.region);
        if (!g.ok()) return InvalidArgumentError("group: the instance tag aws:autoscaling:groupName: " + g.status().message());
        g->source = "aws:autoscaling:groupName";
        out.group = *std::move(g);
      } else if (m.ec2_tags_hidden) {
        out.note =
            "instance tags are not in the instance metadata, so spotvisor cannot see whether this instance is in an "
            "Auto Scaling group: if it is, set spotvisor-group (in the user data) to the group's name, or enable "
            "--instance-metadata-tags; otherwise the group would replace the instance after each on-exit";
      }
    }
    return out;
  }
  if (gce) {
    auto g = ParseMigUrl(v);
    if (!g.ok()) return InvalidArgumentError("group: " + g.status().message() + "; or auto, or none");
    g->source = "the group key";
    out.group = *std::move(g);
  } else if (aws) {
    auto g = ParseAsgName(v, m.region);
    if (!g.ok()) return InvalidArgumentError("group: " + g.status().message() + "; or auto, or none");
    g->source = "the group key";
    out.group = *std::move(g);
  } else {
    return InvalidArgumentError(fmt::format(
        "group: \"{}\" names a group, but no cloud's metadata service answered, so there is no group to leave; "
        "use auto or none off the cloud",
        output::EscapeInvalidUtf8(std::string(v.substr(0, 200)))));
  }
  return out;
}

}  // namespace spotvisor
