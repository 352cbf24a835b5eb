// EC2's advance notices, read from the instance metadata service: the Spot
// interruption notice (meta-data/spot/instance-action: 404 until there is
// one, then {"action": "terminate|stop|hibernate", "time": "...Z"}, about
// two minutes ahead), the rebalance recommendation
// (meta-data/events/recommendations/rebalance: 404 until set, then
// {"noticeTime": "...Z"}, an early warning) and, in an Auto Scaling group,
// the target lifecycle state (meta-data/autoscaling/target-lifecycle-state:
// InService, ..., Terminated when the group is terminating the instance). There is no long-poll: both
// are polled, once a second by default (a link-local request costs nothing;
// AWS's own termination handler polls every 2 s).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "metadata/imds_client.h"
#include "retry/sleeper.h"

namespace spotvisor {

struct Ec2InterruptionNotice {
  std::string action;  // terminate | stop | hibernate
  WallTime time{};     // when the instance is taken
};

// Parsed with checks: an unknown action or a bad time is an error, never a
// throw. The body is escaped for messages.
StatusOr<Ec2InterruptionNotice> ParseInstanceAction(std::string_view body);

struct Ec2NoticeCallbacks {
  std::function<void(const Ec2InterruptionNotice&, const std::string& body)> on_interruption;  // once
  std::function<void(const std::string& body)> on_rebalance;                                  // once
  // In an Auto Scaling group (issue #30): meta-data/autoscaling/target-lifecycle-state
  // became Terminated (scale-in, capacity rebalancing, a person): once. Only
  // polled when set.
  std::function<void(const std::string& state)> on_terminating;
  // First failure of a streak, and the recovery that ends it.
  std::function<void(const Status& first_error)> on_failing;
  std::function<void(int failed_polls)> on_recovered;
};

class Ec2NoticeWatcher {
 public:
  Ec2NoticeWatcher(std::unique_ptr<ImdsClient> imds, const Clock& clock, std::chrono::milliseconds interval,
                   Ec2NoticeCallbacks callbacks);
  ~Ec2NoticeWatcher();  // stops and joins
  void Start();
  void Stop();

 private:
  void Run();
  // One poll of both paths; false on a failure (counted, logged once a streak).
  bool PollOnce();

  std::unique_ptr<ImdsClient> imds_;
  const Clock& clock_;
  std::chrono::milliseconds interval_;
  Ec2NoticeCallbacks cb_;
  std::shared_ptr<CancelSource> cancel_ = std::make_shared<CancelSource>();
  CancellableSleeper sleeper_;
  std::thread thread_;
  bool interrupted_ = false, rebalanced_ = false, terminating_ = false;
  Status last_error_;
};

}  // namespace spotvisor
