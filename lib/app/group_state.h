// `spotvisor runs` asks each run's group how it is now (issue #30): a MIG's
// target size and members (Compute API), an Auto Scaling group's desired
// capacity and instances (Auto Scaling API). Each group is asked once, and
// a failure (no credentials, no permission) is a "?" with the reason, never
// the end of the listing.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "app/runs_command.h"
#include "compute/group.h"

namespace spotvisor {

struct GroupLookup {
  std::optional<GroupState> state;
  std::string error;  // why there is no state
};

// `group`: a boot record's (InstanceGroup::Path()); `zone`: that boot's
// zone, which gives an Auto Scaling group its region.
GroupLookup LookUpGroup(const std::string& group, const std::string& zone, const RemoteOptions& o);

// "1 of 1" (members of target), "gone", "?".
std::string FormatGroupState(const GroupLookup& g);

}  // namespace spotvisor
