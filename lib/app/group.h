// Which group this VM is in (issue #30): the `group` key read against what
// the metadata says (compute/group.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "app/engine.h"
#include "common/status.h"
#include "compute/group.h"

namespace spotvisor {

struct GroupResolution {
  std::optional<InstanceGroup> group;  // nullopt: in no group (or none said)
  // Something the operator should know (EC2 tags hidden: membership unknown).
  std::string note;
};

// `key`: the group key's value (auto | none | a group). An error is a
// configuration error: it names the value and the fix.
StatusOr<GroupResolution> ResolveGroup(std::string_view key, const MetadataSnapshot& metadata);

}  // namespace spotvisor
