// The VM stopping or deleting itself through the Compute Engine API, with
// its own service account's token: what on-exit = stop | delete does.
#pragma once

#include "common/cancel.h"

#include <memory>
#include <string>

#include "common/status.h"
#include "compute/group.h"
#include "http/http_client.h"
#include "retry/sleeper.h"
#include "storage/token_provider.h"

namespace spotvisor {

struct InstanceRef {
  std::string project;  // project/project-id
  std::string zone;     // the last segment of instance/zone
  std::string name;     // instance/name
};

class ComputeClient {
 public:
  virtual ~ComputeClient() = default;
  // POST .../instances/NAME/stop (the disks stay; the VM can be started again).
  // Both honour ctx: each request's timeout is clamped to its deadline and
  // cut short on cancellation, and so is every retry wait.
  virtual Status StopInstance(const CallContext& ctx) = 0;
  // DELETE .../instances/NAME (also ends the billing of its boot disk).
  virtual Status DeleteInstance(const CallContext& ctx) = 0;
};

// `endpoint` defaults to https://compute.googleapis.com/compute/v1; request
// paths (/projects/P/zones/Z/instances/N...) are appended to it.
std::unique_ptr<ComputeClient> MakeComputeClient(std::string endpoint, InstanceRef instance,
                                                 std::unique_ptr<TokenProvider> tokens, Sleeper& sleeper);

// Leaving a managed instance group (group.h), with the same endpoint and token.
std::unique_ptr<GroupClient> MakeMigClient(std::string endpoint, InstanceGroup group, InstanceRef self,
                                           std::unique_ptr<TokenProvider> tokens, Sleeper& sleeper);

}  // namespace spotvisor
