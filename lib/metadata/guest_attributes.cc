#include "metadata/guest_attributes.h"

namespace spotvisor {

GuestAttributesWriter::GuestAttributesWriter(std::unique_ptr<MetadataClient> client,
                                             std::function<void(const Status&)> on_error) {
  std::shared_ptr<MetadataClient> shared(std::move(client));
  put_ = [shared](const std::string& key, const std::string& value) {
    return shared->PutGuestAttribute("spotvisor/" + key, value);
  };
  cancel_ = [shared] { shared->Cancel(); };
  on_error_ = std::move(on_error);
  thread_ = std::thread([this] { Run(); });
}

GuestAttributesWriter::GuestAttributesWriter(std::function<Status(const std::string&, const std::string&)> put,
                                             std::function<void()> cancel, std::function<void(const Status&)> on_error)
    : put_(std::move(put)), cancel_(std::move(cancel)), on_error_(std::move(on_error)), thread_([this] { Run(); }) {}

GuestAttributesWriter::~GuestAttributesWriter() {
  {
    std::unique_lock lk(mu_);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    if (finish_by_ && *finish_by_ < until) until = *finish_by_;
    idle_.wait_until(lk, until, [this] { return pending_.empty() && !busy_; });
    stopping_ = true;
  }
  cv_.notify_all();
  if (cancel_) cancel_();
  thread_.join();
}

void GuestAttributesWriter::FinishBy(std::chrono::steady_clock::time_point by) {
  std::lock_guard lk(mu_);
  if (!finish_by_ || by < *finish_by_) finish_by_ = by;
}

void GuestAttributesWriter::Set(const std::map<std::string, std::string>& values) {
  {
    std::lock_guard lk(mu_);
    for (auto const& [k, v] : values) {
      auto s = sent_.find(k);
      if (s != sent_.end() && s->second == v) {
        pending_.erase(k);
        continue;
      }
      pending_[k] = v;
    }
  }
  cv_.notify_one();
}

void GuestAttributesWriter::Run() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stopping_ || !pending_.empty(); });
    if (stopping_) return;
    auto [key, value] = *pending_.begin();
    pending_.erase(pending_.begin());
    busy_ = true;
    lk.unlock();
    Status s = put_(key, value);
    lk.lock();
    busy_ = false;
    if (s.ok()) {
      sent_[key] = value;
    } else if (!reported_ && s.code() != StatusCode::kCancelled) {
      reported_ = true;
      lk.unlock();
      on_error_(s);
      lk.lock();
    }
    if (pending_.empty()) idle_.notify_all();
  }
}

}  // namespace spotvisor
