// The run's state as guest attributes (spotvisor/phase, trainer_pid,
// last_sync, last_event), so `gcloud compute instances
// get-guest-attributes VM --query-path=spotvisor/` answers from a laptop.
// Writes go out from a thread of their own, the latest value of each key
// winning; a failure is reported once (through `on_error`), never fatal.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "metadata/metadata_client.h"

namespace spotvisor {

class GuestAttributesWriter {
 public:
  GuestAttributesWriter(std::unique_ptr<MetadataClient> client, std::function<void(const Status&)> on_error);
  ~GuestAttributesWriter();  // sends what is pending (for at most 2 s), then stops

  // Thread-safe; only changed values are sent.
  void Set(const std::map<std::string, std::string>& values);

 private:
  void Run();

  std::unique_ptr<MetadataClient> client_;
  std::function<void(const Status&)> on_error_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::map<std::string, std::string> pending_, sent_;
  bool busy_ = false;
  bool stopping_ = false;
  bool reported_ = false;
  std::thread thread_;
};

}  // namespace spotvisor
