#include "supervisor/durability.h"

#include <fmt/format.h>

#include "common/duration.h"

namespace spotvisor {
namespace {

template <class D>
double Seconds(D d) {
  return std::chrono::duration<double>(d).count();
}

std::chrono::milliseconds Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d);
}

// Whole seconds read better in messages than FormatDuration's milliseconds.
std::string Roughly(std::chrono::steady_clock::duration d) {
  auto ms = Ms(d);
  if (ms >= std::chrono::minutes(1)) {
    ms = std::chrono::duration_cast<std::chrono::seconds>(ms);
  } else if (ms >= std::chrono::seconds(1)) {
    ms = ms / 100 * 100;  // "1.5s", not "1s" next to a limit of 1.5s
  }
  return FormatDuration(ms);
}

}  // namespace

std::optional<LogEvent> DurabilityTracker::CaughtUp(SteadyTime at, WallTime wall, SteadyTime now) {
  // A sync's snapshot may predate a later one's that finished first.
  if (caught_up_ && at < *caught_up_) return std::nullopt;
  caught_up_ = at;
  caught_up_wall_ = wall;
  problem_.clear();
  // The next sync gets a whole sync-alert-after from now: the caught-up
  // point is the snapshot of an upload that may itself have taken longer.
  quiet_until_ = now + alert_after_;
  if (level_ == 0) return std::nullopt;
  level_ = 0;
  return LogEvent{Severity::kNotice, "sync.recovered",
                  fmt::format("checkpoint syncs caught up again: the bucket holds the checkpoint dir as of {}",
                              FormatRfc3339(wall)),
                  {{"caught_up_at", FormatRfc3339(wall)}}};
}

void DurabilityTracker::Progress(SteadyTime at, std::uint64_t bytes_done) {
  if (!in_flight_since_) return;
  SteadyTime from = moving_since_.value_or(*in_flight_since_);
  double secs = std::chrono::duration<double>(at - from).count();
  bool moved = bytes_done > last_bytes_ && (secs <= 0 || static_cast<double>(bytes_done - last_bytes_) / secs >= kMinRate);
  if (moved) last_move_ = at;
  moving_since_ = at;
  last_bytes_ = bytes_done;
}

std::chrono::milliseconds DurabilityTracker::Window() const {
  // Progress is reported every few seconds: at least three reports' worth.
  return std::max<std::chrono::milliseconds>(std::chrono::seconds(15), alert_after_ / 2);
}

bool DurabilityTracker::Moving(SteadyTime now) const {
  return in_flight_since_ && last_move_ && now - *last_move_ < Window();
}

std::optional<SteadyTime> DurabilityTracker::NextCheck() const {
  if (alert_after_.count() == 0 || !caught_up_ || level_ >= 2) return std::nullopt;
  auto next = *caught_up_ + (level_ + 1) * alert_after_;
  if (quiet_until_) next = std::max(next, *quiet_until_);
  // A sync moving bytes holds the level where it is: look again once it
  // could have stopped.
  if (in_flight_since_ && last_move_) next = std::max(next, *last_move_ + Window());
  return next;
}

std::string DurabilityTracker::Cause(SteadyTime now) const {
  // Only a sync running for the whole window can be said to have moved
  // nothing in it (a sync of 1.9 s was once said to have moved nothing
  // "in the last 15s").
  if (in_flight_since_ && now - *in_flight_since_ >= std::max<std::chrono::steady_clock::duration>(alert_after_ / 2, Window())) {
    return fmt::format("a sync has been running for {} and has moved {} in the last {} (a slow or hung upload; see "
                       "sync.* events)",
                       Roughly(now - *in_flight_since_),
                       last_move_ ? "less than 100 kB/s" : "nothing", Roughly(Window()));
  }
  if (!problem_.empty()) return problem_;
  if (in_flight_since_) return fmt::format("a sync is running (for {})", Roughly(now - *in_flight_since_));
  return "no sync has caught up since then (is sync-interval 0? then only `spotvisor sync` and the final sync upload)";
}

std::optional<LogEvent> DurabilityTracker::Check(SteadyTime now, const std::optional<UncommittedView>& u) {
  auto next = NextCheck();
  if (!next || now < *next || Moving(now)) return std::nullopt;
  auto lag = now - *caught_up_;
  int level = lag >= 2 * alert_after_ ? 2 : 1;
  level_ = level;
  cause_ = Cause(now);
  std::string at_risk =
      u ? (u->files == 0 ? "nothing on disk is newer than the bucket's commit yet"
                         : fmt::format("{} in {} file(s) on disk are not in the bucket", FormatBytes(u->bytes), u->files))
        : "what is on disk was not counted yet";
  nlohmann::json f = {{"lag_s", Seconds(lag)},
                      {"limit_s", Seconds(alert_after_)},
                      {"caught_up_at", FormatRfc3339(caught_up_wall_)},
                      {"cause", cause_},
                      {"level", level}};
  if (u) {
    f["uncommitted_files"] = u->files;
    f["uncommitted_bytes"] = u->bytes;
  }
  return LogEvent{level == 1 ? Severity::kWarning : Severity::kError, "sync.stalled",
                  fmt::format("checkpoints have not reached the bucket for {} (sync-alert-after {}{}): {}; {}",
                              Roughly(lag), FormatDuration(alert_after_), level == 2 ? ", twice over" : "", cause_,
                              at_risk),
                  std::move(f)};
}

nlohmann::json DurabilityTracker::Json(SteadyTime now, WallTime wall_now, const CommittedView& c,
                                       const std::optional<UncommittedView>& u, std::optional<WallTime> u_as_of) const {
  nlohmann::json j = {{"sequence", c.sequence}, {"files", c.files}, {"bytes", c.bytes}};
  j["committed_at"] = c.sequence > 0 && !c.committed_at.empty() ? nlohmann::json(c.committed_at) : nlohmann::json(nullptr);
  // Another VM's clock may be ahead of ours: never a negative age.
  j["age_s"] = c.sequence > 0 && c.committed_time ? nlohmann::json(std::max(0.0, Seconds(wall_now - *c.committed_time)))
                                                  : nlohmann::json(nullptr);
  if (c.sequence > 0 && !c.instance.empty()) j["instance"] = c.instance;
  if (u) {
    j["uncommitted_files"] = u->files;
    j["uncommitted_bytes"] = u->bytes;
    if (u_as_of) j["uncommitted_as_of"] = FormatRfc3339(*u_as_of);
  }
  if (caught_up_) {
    j["caught_up_at"] = FormatRfc3339(caught_up_wall_);
    j["lag_s"] = Seconds(now - *caught_up_);
  }
  j["stalled"] = level_ > 0;
  if (level_ > 0) j["stall_cause"] = cause_;
  return j;
}

LogEvent DurabilityTracker::AgeEvent(SteadyTime now, WallTime wall_now, const CommittedView& c,
                                     const std::optional<UncommittedView>& u) const {
  auto j = Json(now, wall_now, c, u, std::nullopt);
  std::string newest =
      c.sequence == 0 ? "no checkpoint committed yet"
      : j["age_s"].is_number()
          ? fmt::format("newest commit #{} is {} old", c.sequence,
                        Roughly(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(j["age_s"].get<double>()))))
          : fmt::format("newest commit #{} (its time \"{}\" is not readable)", c.sequence, c.committed_at);
  std::string risk = !u ? "" : u->files == 0 ? "; nothing on disk is newer" : fmt::format("; {} in {} file(s) not committed yet", FormatBytes(u->bytes), u->files);
  std::string lag = caught_up_ ? fmt::format("; the bucket last caught up {} ago", Roughly(now - *caught_up_)) : "";
  return LogEvent{level_ == 0 ? Severity::kInfo : Severity::kWarning, "checkpoint.age", newest + risk + lag, std::move(j)};
}

}  // namespace spotvisor
