// `spotvisor runs` asks each run's group how it is now (issue #30): a MIG's
// target size and members (Compute API), an Auto Scaling group's desired
// capacity and instances (Auto Scaling API). Each group (by name and
// location) is asked once; credentials are made once per cloud, and once
// they fail no group of that cloud is asked again. A failure is a "?" with
// the reason, never the end of the listing.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "app/runs_command.h"
#include "common/status.h"
#include "compute/group.h"
#include "storage/aws_credentials.h"
#include "storage/token_provider.h"

namespace spotvisor {

struct GroupLookup {
  std::optional<GroupState> state;
  std::string error;  // why there is no state
};

class GroupStates {
 public:
  explicit GroupStates(const RemoteOptions& o) : o_(o) {}
  // `group`: a boot record's (InstanceGroup::Path()); `zone`: that boot's
  // zone, which gives an Auto Scaling group its region.
  const GroupLookup& Get(const std::string& group, const std::string& zone);

 private:
  GroupLookup Ask(const std::string& group, const std::string& zone);

  const RemoteOptions& o_;
  std::map<std::string, GroupLookup> seen_;  // by group and region
  std::optional<StatusOr<std::shared_ptr<TokenProvider>>> google_;
  std::optional<StatusOr<std::shared_ptr<AwsCredentialProvider>>> aws_;
  std::shared_ptr<Status> google_failed_ = std::make_shared<Status>();  // a token that could not be had
  std::shared_ptr<Status> aws_failed_ = std::make_shared<Status>();
};

// "1 of 1" (members of target), "gone", "?".
std::string FormatGroupState(const GroupLookup& g);

}  // namespace spotvisor
