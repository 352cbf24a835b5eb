#include "app/group.h"

#include <fmt/format.h>

#include "common/clock.h"
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

void AnnounceGroup(const InstanceGroup& group, Logger& logger) {
  logger.Info("cloud.group",
              fmt::format("in {} (from {}): a preemption is left to the group, which brings the VM back; the run's end "
                          "leaves the group",
                          group.Describe(), group.source),
              {{"group", group.Path()}, {"group_kind", group.KindName()}, {"source", group.source}});
}

std::string RegionalDatasetHint(const InstanceGroup& group, const std::string& zone) {
  if (group.kind != InstanceGroup::Kind::kRegionalMig) return "";
  // Issue #30 point 7: the dataset must reach whichever zone the group chose.
  return fmt::format(
      "This VM is in {}, which may create it in any zone of {} (this one: {}), and a zonal persistent disk exists in "
      "one zone only: give the dataset as a regional persistent disk (attached read-only in both its zones, and the "
      "group limited to them with --zones), as a disk made for each VM from a snapshot (spotvisor launch "
      "--dataset-snapshot), through the bucket mount (bucket-mount), or baked into the image",
      group.Describe(), group.location, zone);
}

bool LeaveAfterConfigError(GroupClient& client, const InstanceGroup& group, Logger& logger) {
  logger.Log(LogEvent{Severity::kNotice, "shutdown.start",
                      fmt::format("leaving {}: {} on this VM, so that the group does not bring it back with the same "
                                  "configuration",
                                  group.Describe(), client.LeaveCall()),
                      {{"action", "leave"}, {"group", group.Path()}, {"group_kind", group.KindName()}}});
  SystemClock clock;
  CallContext ctx;
  ctx.clock = &clock;
  ctx.deadline = clock.Now() + std::chrono::seconds(30);
  auto s = client.Leave(ctx);
  if (s.ok()) {
    logger.Info("shutdown.api_done", fmt::format("{} accepted: this VM is leaving it", group.Describe()));
    return true;
  }
  logger.Error("shutdown.api_failed", fmt::format("leaving the group failed: {}; powering off instead", s.message()),
               {{"error", s.message()}, {"group", group.Path()}});
  return false;
}

}  // namespace spotvisor
