#include "metadata/ec2_notices.h"

#include "common/strings.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "log/logger.h"
#include "output/utf8.h"

namespace spotvisor {

StatusOr<Ec2InterruptionNotice> ParseInstanceAction(std::string_view body) {
  auto shown = [&] { return output::EscapeInvalidUtf8(std::string(body.substr(0, 200))); };
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object()) return InvalidArgumentError("spot/instance-action is not a JSON object: " + shown());
  auto a = j.find("action");
  auto t = j.find("time");
  if (a == j.end() || !a->is_string() || t == j.end() || !t->is_string()) {
    return InvalidArgumentError("spot/instance-action has no action or time: " + shown());
  }
  Ec2InterruptionNotice n;
  n.action = a->get<std::string>();
  if (n.action != "terminate" && n.action != "stop" && n.action != "hibernate") {
    return InvalidArgumentError("spot/instance-action: unknown action: " + shown());
  }
  auto when = ParseRfc3339(t->get<std::string>());
  if (!when) return InvalidArgumentError("spot/instance-action: time is not an RFC 3339 time: " + shown());
  n.time = *when;
  return n;
}

Ec2NoticeWatcher::Ec2NoticeWatcher(std::unique_ptr<ImdsClient> imds, const Clock& clock, std::chrono::milliseconds interval,
                                   Ec2NoticeCallbacks callbacks)
    : imds_(std::move(imds)), clock_(clock), interval_(interval), cb_(std::move(callbacks)) {}

Ec2NoticeWatcher::~Ec2NoticeWatcher() { Stop(); }

void Ec2NoticeWatcher::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Ec2NoticeWatcher::Stop() {
  cancel_->Cancel();
  sleeper_.Cancel();
  if (thread_.joinable()) thread_.join();
}

bool Ec2NoticeWatcher::PollOnce() {
  CallContext ctx;
  ctx.cancel = cancel_;
  ctx.clock = &clock_;
  // A poll that hangs must not delay the next one by much: 2 s, as AWS's
  // termination handler allows.
  ctx.deadline = clock_.Now() + std::chrono::seconds(2);
  bool ok = true;
  if (!interrupted_) {
    auto body = imds_->Get("meta-data/spot/instance-action", ctx);
    if (body.ok()) {
      auto n = ParseInstanceAction(*body);
      std::string shown = output::EscapeInvalidUtf8(body->substr(0, 500));
      if (n.ok()) {
        interrupted_ = true;
        cb_.on_interruption(*n, shown);
      } else {
        // Something is there but unreadable: an interruption all the same,
        // with no time; better a stop too early than a lost checkpoint.
        interrupted_ = true;
        cb_.on_interruption(Ec2InterruptionNotice{"terminate", clock_.WallNow() + std::chrono::minutes(2)}, shown);
      }
    } else if (body.status().code() != StatusCode::kNotFound) {
      if (ctx.cancelled()) return true;
      ok = false;
      last_error_ = body.status();
    }
  }
  if (!rebalanced_ && !interrupted_) {
    auto body = imds_->Get("meta-data/events/recommendations/rebalance", ctx.WithDeadline(clock_.Now() + std::chrono::seconds(2)));
    if (body.ok()) {
      rebalanced_ = true;
      cb_.on_rebalance(output::EscapeInvalidUtf8(body->substr(0, 500)));
    } else if (body.status().code() != StatusCode::kNotFound && !ctx.cancelled() && ok) {
      ok = false;
      last_error_ = body.status();
    }
  }
  if (cb_.on_terminating && !terminating_ && !interrupted_) {
    auto body = imds_->Get("meta-data/autoscaling/target-lifecycle-state", ctx.WithDeadline(clock_.Now() + std::chrono::seconds(2)));
    if (body.ok() && Trim(*body) == "Terminated") {
      terminating_ = true;
      cb_.on_terminating(std::string(Trim(*body)));
    } else if (!body.ok() && body.status().code() != StatusCode::kNotFound && !ctx.cancelled() && ok) {
      ok = false;
      last_error_ = body.status();
    }
  }
  return ok;
}

void Ec2NoticeWatcher::Run() {
  int failed = 0;
  while (!cancel_->cancelled()) {
    bool ok = PollOnce();
    if (!ok) {
      if (failed++ == 0 && cb_.on_failing) cb_.on_failing(last_error_);
    } else if (failed > 0) {
      if (cb_.on_recovered) cb_.on_recovered(failed);
      failed = 0;
    }
    if (interrupted_) return;  // nothing more to wait for
    if (!sleeper_.SleepFor(interval_)) return;
  }
}

}  // namespace spotvisor
