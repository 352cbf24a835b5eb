// Which group this VM is in (issue #30): the `group` key read against what
// the metadata says (compute/group.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "app/engine.h"
#include "common/status.h"
#include "compute/group.h"
#include "log/logger.h"

namespace spotvisor {

struct GroupResolution {
  std::optional<InstanceGroup> group;  // nullopt: in no group (or none said)
  // Something the operator should know (EC2 tags hidden: membership unknown).
  std::string note;
};

// `key`: the group key's value (auto | none | a group). An error is a
// configuration error: it names the value and the fix.
StatusOr<GroupResolution> ResolveGroup(std::string_view key, const MetadataSnapshot& metadata);

// `cloud.group`, once at start: the VM knows its group.
void AnnounceGroup(const InstanceGroup& group, Logger& logger);

// What mount.failed adds when a regional MIG's VM has no dataset disk: the
// group may have put the VM in a zone the zonal disk is not in.
std::string RegionalDatasetHint(const InstanceGroup& group, const std::string& zone);

// A broken configuration in a group: leave it (the group would bring a
// powered-off VM back with the same configuration, boot after boot), within
// 30 s, saying so as the supervisor's ending does. False: the leave failed
// (said too) and the caller powers off.
bool LeaveAfterConfigError(GroupClient& client, const InstanceGroup& group, Logger& logger);

}  // namespace spotvisor
