// How durable the trainer's progress is, as a number people can watch
// (issue #14): the newest commit's age, the bytes on disk not yet committed,
// and how long ago the bucket last caught up with the checkpoint dir (the
// "lag": a preemption now loses at most that much work). It also decides
// when syncing has stalled: WARNING once the lag passes sync-alert-after,
// ERROR (and, with sync-stall-action = stop, the end of the run) at twice
// that. No I/O and no timers: the supervisor feeds it facts and times, and
// arms its one timer for NextCheck().
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/units.h"
#include "log/logger.h"
#include "sync/sync_engine.h"

namespace spotvisor {

class DurabilityTracker {
 public:
  // `alert_after` 0: never stalled.
  explicit DurabilityTracker(std::chrono::milliseconds alert_after) : alert_after_(alert_after) {}

  // The bucket held everything in the checkpoint dir as of `at` (a restore;
  // a sync that committed or found nothing new, as of its snapshot). Returns
  // the `sync.recovered` event if a stall had been reported.
  // `now`: when that was learned; no stall is said within sync-alert-after
  // of it (issue #32: recovered, then ERROR stalled 1 ms later, because the
  // caught-up point was the snapshot of a long upload).
  std::optional<LogEvent> CaughtUp(SteadyTime at, WallTime wall, SteadyTime now);
  // Why the last sync did not catch up (failed, deferred, fenced).
  void Problem(std::string why) { problem_ = std::move(why); }
  // A sync is in flight since `at` (nullopt: none).
  void SyncInFlight(std::optional<SteadyTime> at) {
    in_flight_since_ = at;
    last_bytes_ = 0;
    moving_since_.reset();
    last_move_.reset();
  }
  // The sync in flight has moved `bytes_done` bytes by `at` (its progress
  // reports). A sync that keeps moving bytes at kMinRate or more is not
  // stalled, however old the last commit (issue #32: a long healthy upload
  // paged people): the stall level rises only once it stops moving.
  void Progress(SteadyTime at, std::uint64_t bytes_done);
  static constexpr double kMinRate = 100e3;  // bytes/s: slower than this is not moving

  // When the stall level would next rise (nullopt: never, or not started).
  std::optional<SteadyTime> NextCheck() const;
  // The `sync.stalled` event if the level rose at `now` (once per level).
  // `uncommitted`: the latest count of what is at risk, if known.
  std::optional<LogEvent> Check(SteadyTime now, const std::optional<UncommittedView>& uncommitted);
  // 0: not stalled; 1: WARNING logged; 2: ERROR logged.
  int level() const { return level_; }
  // The cause as the last Check named it.
  const std::string& cause() const { return cause_; }

  // The block status.json, guest attributes and `checkpoint.age` carry.
  nlohmann::json Json(SteadyTime now, WallTime wall_now, const CommittedView& committed,
                      const std::optional<UncommittedView>& uncommitted, std::optional<WallTime> uncommitted_as_of) const;
  // The periodic `checkpoint.age` event.
  LogEvent AgeEvent(SteadyTime now, WallTime wall_now, const CommittedView& committed,
                    const std::optional<UncommittedView>& uncommitted) const;

 private:
  std::string Cause(SteadyTime now) const;
  // The sync in flight moved bytes at kMinRate or more within Window() of `now`.
  bool Moving(SteadyTime now) const;
  std::chrono::milliseconds Window() const;

  std::chrono::milliseconds alert_after_;
  std::optional<SteadyTime> caught_up_;
  WallTime caught_up_wall_{};
  std::optional<SteadyTime> in_flight_since_;
  std::uint64_t last_bytes_ = 0;
  std::optional<SteadyTime> moving_since_;  // the progress report before the last one that moved
  std::optional<SteadyTime> last_move_;     // the last progress report that moved at kMinRate
  std::optional<SteadyTime> quiet_until_;   // no stall said before this (just recovered)
  std::string problem_;
  std::string cause_;
  int level_ = 0;
};

}  // namespace spotvisor
