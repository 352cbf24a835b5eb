#include "metadata/watcher.h"

#include <fmt/format.h>

namespace spotvisor {

MetadataWatcher::MetadataWatcher(std::unique_ptr<MetadataClient> client, std::string path,
                                 MetadataValue initial, WatcherOptions options,
                                 WatcherCallbacks callbacks)
    : client_(std::move(client)),
      path_(std::move(path)),
      current_(std::move(initial)),
      options_(std::move(options)),
      callbacks_(std::move(callbacks)) {}

MetadataWatcher::~MetadataWatcher() { Stop(); }

void MetadataWatcher::Start() { thread_ = std::thread([this] { Run(); }); }

void MetadataWatcher::Stop() {
  sleeper_.Cancel();
  client_->Cancel();
  if (thread_.joinable()) thread_.join();
}

void MetadataWatcher::Run() {
  int failures = 0;
  while (!sleeper_.cancelled()) {
    auto r = client_->Watch(path_, current_.etag, options_.timeout_sec);
    if (sleeper_.cancelled()) return;
    if (r.ok()) {
      bool changed = r->value != current_.value;
      bool has_etag = !r->etag.empty();
      current_ = *std::move(r);
      if (changed && callbacks_.on_change) callbacks_.on_change(current_.value);
      if (has_etag) {
        if (failures > 0 && callbacks_.on_recovered) callbacks_.on_recovered(failures);
        failures = 0;
        options_.backoff->Reset();
        continue;
      }
      // Without an ETag the next request cannot wait for a change: the
      // server answers at once, and an unpaced loop would spin a core and
      // flood it. Poll with the backoff instead, as a failure streak.
      r = UnavailableError(fmt::format("metadata {}: answer without an ETag; polling with backoff instead of waiting for "
                                       "changes",
                                       path_));
    }
    if (!r.ok() && options_.absent && options_.absent(r.status())) {
      if (failures > 0 && callbacks_.on_recovered) callbacks_.on_recovered(failures);
      failures = 0;
      options_.backoff->Reset();
      bool changed = current_.value != options_.absent_value;
      // The next request asks for the current value at once (an ETag that
      // cannot match), so the key being defined meanwhile is not missed.
      current_ = MetadataValue{options_.absent_value, "0"};
      if (changed && callbacks_.on_change) callbacks_.on_change(current_.value);
      if (!sleeper_.SleepFor(options_.absent_poll)) return;
      continue;
    }
    // Never give up, not even on 404: a key can be defined later, and a
    // watcher that stops would silently miss the preemption it exists for.
    if (failures++ == 0 && callbacks_.on_failing) callbacks_.on_failing(r.status());
    if (!sleeper_.SleepFor(options_.backoff->OnCompletion())) return;
  }
}

}  // namespace spotvisor
