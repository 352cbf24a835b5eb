#include "supervisor/observers.h"

#include <fmt/format.h>

#include "output/utf8.h"
#include "state/status_file.h"

namespace spotvisor {
namespace {
// Text from outside (a trainer's line, a path) may not be UTF-8: escaped, never thrown on.
std::string Dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
}  // namespace

nlohmann::json StatusFileObserver::Json(const RunView& v) const {
  nlohmann::json j = {
      {"run_id", v.run_id},
      {"mode", v.mode},
      {"phase", v.phase},
      {"state", v.state},
      {"since", FormatRfc3339(v.since)},
      {"spotvisor_pid", v.spotvisor_pid},
      {"trainer_pid", v.trainer_pid ? nlohmann::json(*v.trainer_pid) : nlohmann::json(nullptr)},
      {"last_event", {{"event", v.last_event}, {"message", v.last_message}, {"time", FormatRfc3339(clock_.WallNow())}}},
  };
  if (!v.reason.empty()) j["reason"] = v.reason;
  if (!v.last_sync.is_null()) j["last_sync"] = v.last_sync;
  if (!v.checkpoint.is_null()) j["checkpoint"] = v.checkpoint;
  if (!v.transfer.is_null()) j["transfer"] = v.transfer;
  if (!v.gang.is_null()) j["gang"] = v.gang;
  // Identifies this process beyond its pid (`spotvisor sync` checks it).
  if (v.start_time_ticks) j["start_time_ticks"] = *v.start_time_ticks;
  if (!v.boot_id.empty()) j["boot_id"] = v.boot_id;
  if (!v.bucket.empty()) j["bucket"] = v.bucket;
  if (!v.group.empty()) j["group"] = v.group;
  if (v.exit_code) j["exit_code"] = *v.exit_code;
  if (v.deadline) {
    j["deadline"] = FormatRfc3339(clock_.WallNow() + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                         *v.deadline - clock_.Now()));
  }
  return j;
}

void StatusFileObserver::OnChange(const RunView& view) {
  auto s = WriteStatusFile(state_dir_, Json(view));
  if (!s.ok() && s.message() != error_) {
    error_ = s.message();
    logger_.Warn("status.write_failed", "cannot write status.json: " + s.message());
  }
}

void GuestAttributesObserver::OnChange(const RunView& v) {
  writer_->Set({
      {"phase", v.phase},
      {"since", FormatRfc3339(v.since)},
      {"trainer_pid", v.trainer_pid ? std::to_string(*v.trainer_pid) : ""},
      // Read by a person through `gcloud ... get-guest-attributes`: a line of
      // text, like the log's, not JSON inside a string.
      {"last_event", output::EscapeInvalidUtf8(v.last_event + ": " + v.last_message)},
      {"last_sync", v.last_sync.is_null() ? "" : Dump(v.last_sync)},
      {"reason", v.reason},
      {"checkpoint", v.checkpoint.is_null() ? "" : Dump(v.checkpoint)},
      {"transfer", v.transfer.is_null() ? "" : Dump(v.transfer)},
      {"gang", v.gang.is_null() ? "" : Dump(v.gang)},
      {"group", v.group},
  });
}

void InstanceTagObserver::OnChange(const RunView& v) {
  writer_->Set({{"phase", v.reason.empty() ? v.phase : fmt::format("{} ({})", v.phase, v.reason)}});
}

std::string SystemdObserver::Summary(const RunView& v) {
  std::string status = v.phase;
  if (!v.reason.empty()) status += fmt::format(" ({})", v.reason);
  if (v.trainer_pid) status += fmt::format("; trainer pid {}", *v.trainer_pid);
  if (v.last_sync.is_object()) {
    auto const& s = v.last_sync;
    bool ok = s.contains("ok") && s["ok"].is_boolean() && s["ok"].get<bool>();
    std::string time = s.contains("time") && s["time"].is_string() ? s["time"].get<std::string>() : "";
    std::int64_t seq = s.contains("sequence") && s["sequence"].is_number_integer() ? s["sequence"].get<std::int64_t>() : 0;
    status += ok ? fmt::format("; last sync #{} at {}", seq, time) : fmt::format("; last sync FAILED at {}", time);
  }
  return status;
}

void SystemdObserver::OnChange(const RunView& v) {
  deadline_ = v.deadline;
  std::string message;
  auto status = Summary(v);
  if (status != status_) {
    status_ = status;
    message = "STATUS=" + status;
  }
  if (v.ending && !stopping_) {
    stopping_ = true;
    message += message.empty() ? "STOPPING=1" : "\nSTOPPING=1";
  }
  if (message.empty()) return;
  notifier_->Notify(message);
  if (stopping_ && !closed_) Extend();
}

void SystemdObserver::Extend() {
  auto extend = std::chrono::microseconds(std::chrono::seconds(30));
  if (deadline_) {
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(*deadline_ - clock_.Now()) + std::chrono::seconds(15);
    extend = std::max(extend, left);
  }
  notifier_->Notify(fmt::format("EXTEND_TIMEOUT_USEC={}", extend.count()));
  extend_timer_.expires_after(std::chrono::seconds(10));
  extend_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec && !closed_) Extend();
  });
}

void SystemdObserver::Close() {
  closed_ = true;
  extend_timer_.cancel();
}

}  // namespace spotvisor
