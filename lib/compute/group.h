// The group a VM belongs to (issue #30): a GCE managed instance group (zonal
// or regional) or an EC2 Auto Scaling group. The group is what brings a
// preempted VM back, so a VM in one never stops or deletes itself when its
// run is over (the group would undo that, boot after boot): it leaves
// through the group, which lowers the group's size.
//
// Where it comes from (`group` key: auto | none | a group):
//   GCE   the instance attribute created-by,
//         projects/NUM/zones/Z/instanceGroupManagers/NAME or
//         projects/NUM/regions/R/instanceGroupManagers/NAME
//   EC2   the instance tag aws:autoscaling:groupName
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/cancel.h"
#include "common/status.h"

namespace spotvisor {

struct InstanceGroup {
  enum class Kind { kZonalMig, kRegionalMig, kAsg };
  Kind kind = Kind::kZonalMig;
  std::string project;   // GCE: the project (number or id), as the URL gives it
  std::string location;  // GCE: the zone or region; EC2: the region
  std::string name;
  std::string source;  // where it was learnt: "created-by", "aws:autoscaling:groupName", "the group key"

  bool gce() const { return kind != Kind::kAsg; }
  // projects/P/zones/Z/instanceGroupManagers/N (or regions/R), or the ASG's name.
  std::string Path() const;
  // "zonal MIG trainers (us-central1-a)", "Auto Scaling group trainers (eu-west-1)".
  std::string Describe() const;
  std::string KindName() const;  // zonal-mig, regional-mig, asg
};

// A MIG's URL: full (https://www.googleapis.com/compute/v1/projects/...,
// https://compute.googleapis.com/compute/v1/projects/...) or partial
// (projects/...). Anything else is an error that names the value.
StatusOr<InstanceGroup> ParseMigUrl(std::string_view text);
// An Auto Scaling group's name: 1-255 characters, no control characters.
StatusOr<InstanceGroup> ParseAsgName(std::string_view text, std::string region);

// A group as it is now (`spotvisor runs` on a laptop).
struct GroupState {
  bool gone = false;  // the group no longer exists
  int target = 0;     // GCE: the target size; EC2: the desired capacity
  int instances = 0;  // its members now, in any state
};

// How a VM leaves its group, or is replaced by it.
class GroupClient {
 public:
  virtual ~GroupClient() = default;
  // The group now: GCE instanceGroupManagers.get and .listManagedInstances;
  // EC2 DescribeAutoScalingGroups. A group that is not there is `gone`, not
  // an error. Needs no VM: the client may be made with an empty one.
  virtual StatusOr<GroupState> State(const CallContext& ctx) = 0;
  // Deletes this VM through its group and lowers the group's target size /
  // desired capacity by one: nothing comes back in its place.
  // GCE instanceGroupManagers.deleteInstances (skipInstancesOnValidationError);
  // EC2 TerminateInstanceInAutoScalingGroup, ShouldDecrementDesiredCapacity.
  virtual Status Leave(const CallContext& ctx) = 0;
  // "instanceGroupManagers.deleteInstances" etc., for messages.
  virtual std::string LeaveCall() const = 0;
  // group-delete-when-empty: when this VM is the group's last, it is taken
  // out of the group without being deleted (GCE abandonInstances, EC2
  // DetachInstances), the now empty group and then its template are
  // deleted, and last this VM itself; `deleted` names what went. Otherwise
  // (others stay, or no way to tell) Leave(), and `skipped` says why when
  // that was not the plain "others stay".
  virtual Status LeaveAndCleanUp(const CallContext& ctx, std::vector<std::string>* deleted, std::string* skipped) {
    (void)deleted;
    (void)skipped;
    return Leave(ctx);
  }
  // EC2: the group is terminating this instance and a lifecycle hook
  // (autoscaling:EC2_INSTANCE_TERMINATING) holds it in Terminating:Wait:
  // CompleteLifecycleAction (CONTINUE) on each such hook of the group, once
  // the final sync is over. `hooks` gets their names. GCE: nothing to do.
  virtual Status CompleteTermination(const CallContext& ctx, std::vector<std::string>* hooks) {
    (void)ctx;
    (void)hooks;
    return OkStatus();
  }
};

}  // namespace spotvisor
