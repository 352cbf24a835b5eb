// The cloud spotvisor runs on, behind one interface (issue #13): what the
// daemon needs from "the cloud", with GCE (gce_cloud.cc) and EC2
// (ec2_cloud.cc) side by side. The object store is chosen by the bucket's
// URL instead (gs://, s3://, file://: MakeSyncEngine), so a run on one
// cloud may keep its checkpoints in another's store.
//
// What comes from where:
//   identity, zone/region, the configuration layers, a notice already
//   there at boot   the metadata probe (LoadCloud in engine.cc, both clouds
//                   asked in parallel) -> MetadataSnapshot
//   logs            Cloud::MakeLogSink (Cloud Logging / CloudWatch Logs)
//   status          Cloud::AddInstanceControl (guest attributes / the
//                   spotvisor-phase instance tag)
//   stop, delete    Cloud::AddInstanceControl (Compute API / EC2 API)
//   the group       Cloud::MakeGroupClient (MIG deleteInstances / Auto
//                   Scaling TerminateInstanceInAutoScalingGroup)
//   notices         Cloud::WatchNotices (instance/preempted and maintenance
//                   long-polls / spot instance-action and rebalance polls,
//                   with the deadline EC2's notice gives)
//   credentials     each client's own (the metadata server's token / the
//                   instance role over IMDSv2), never logged
#pragma once

#include <memory>
#include <string>

#include "app/engine.h"
#include "common/clock.h"
#include "common/status.h"
#include "compute/group.h"
#include "config/config.h"
#include "log/logger.h"
#include "metadata/metadata_client.h"
#include "retry/sleeper.h"
#include "supervisor/supervisor.h"

namespace spotvisor {

// Watches the cloud's notices and tells the supervisor.
class NoticeWatch {
 public:
  virtual ~NoticeWatch() = default;
  virtual void Start() = 0;
  virtual void Stop() = 0;
};

class Cloud {
 public:
  virtual ~Cloud() = default;
  virtual std::string Name() const = 0;  // "gce", "aws": cloud.detected's `cloud`
  // Logs cloud.detected, and what the operator should know about this
  // machine's metadata before the configuration is used.
  virtual void Announce(Logger& logger) const = 0;
  // The cloud's log API, for log-to = api (or auto on the cloud itself).
  // `r` is the raw configuration: the API must work even when some key is
  // invalid, so that the config.error reaches it. `description` is for log.api.
  virtual StatusOr<std::unique_ptr<LogSink>> MakeLogSink(const ConfigResult& r, std::string& description,
                                                         nlohmann::json& fields) = 0;
  // Where the run's phase is published without ssh, and how this machine
  // stops or deletes itself (on-exit = stop | delete).
  virtual void AddInstanceControl(const Config& config, SupervisorOptions& so, Sleeper& retry_sleeper,
                                  Logger& logger) = 0;
  // How this VM leaves `group` (issue #30): instanceGroupManagers.deleteInstances
  // through `compute_endpoint` on GCE, TerminateInstanceInAutoScalingGroup on
  // EC2. Null when the cloud cannot say who this VM is (EC2 without a region).
  virtual std::unique_ptr<GroupClient> MakeGroupClient(const InstanceGroup& group, const std::string& compute_endpoint,
                                                       Sleeper& sleeper) = 0;
  // Preemption or interruption, maintenance: fed to `supervisor`.
  // `group`: in an Auto Scaling group, its target lifecycle state is watched too.
  virtual std::unique_ptr<NoticeWatch> WatchNotices(const Config& config, Supervisor& supervisor, Logger& logger,
                                                    const std::optional<InstanceGroup>& group) = 0;
};

// nullptr when no metadata service answered (a laptop, a CI runner).
std::unique_ptr<Cloud> MakeCloud(const MetadataSnapshot& metadata, Mode mode, const Clock& clock);
std::unique_ptr<Cloud> MakeGceCloud(const MetadataSnapshot& metadata, Mode mode, const Clock& clock);
std::unique_ptr<Cloud> MakeEc2Cloud(const MetadataSnapshot& metadata, const Clock& clock);

// The GCE metadata server's client, as every GCE part uses it.
bool MetadataRequired(Mode mode);
std::unique_ptr<MetadataClient> NewMetadataClient(Mode mode);

}  // namespace spotvisor
