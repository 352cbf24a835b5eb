// The run's state as guest attributes (spotvisor/phase, trainer_pid,
// last_sync, last_event), so `gcloud compute instances
// get-guest-attributes VM --query-path=spotvisor/` answers from a laptop.
// Writes go out from a thread of their own, the latest value of each key
// winning; a failure is reported once (through `on_error`), never fatal.
// On EC2 the same writer sets instance tags instead.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "metadata/metadata_client.h"

namespace spotvisor {

class GuestAttributesWriter {
 public:
  GuestAttributesWriter(std::unique_ptr<MetadataClient> client, std::function<void(const Status&)> on_error);
  // The same, writing each KEY through `put` (EC2: an instance tag) and
  // cutting a write short with `cancel` at the end.
  GuestAttributesWriter(std::function<Status(const std::string& key, const std::string& value)> put,
                        std::function<void()> cancel, std::function<void(const Status&)> on_error);
  ~GuestAttributesWriter();  // sends what is pending (for at most 2 s, and not past FinishBy), then stops

  // Thread-safe; only changed values are sent.
  void Set(const std::map<std::string, std::string>& values);
  // The last writes must be done by `by` (after a preemption notice: the
  // machine is taken soon after); the destructor waits no longer.
  void FinishBy(std::chrono::steady_clock::time_point by);

 private:
  void Run();

  std::function<Status(const std::string&, const std::string&)> put_;
  std::function<void()> cancel_;
  std::function<void(const Status&)> on_error_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::map<std::string, std::string> pending_, sent_;
  bool busy_ = false;
  bool stopping_ = false;
  std::optional<std::chrono::steady_clock::time_point> finish_by_;
  bool reported_ = false;
  std::thread thread_;
};

}  // namespace spotvisor
