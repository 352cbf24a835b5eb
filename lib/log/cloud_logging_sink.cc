#include "log/cloud_logging_sink.h"

#include "log/async_sink.h"

#include <cstdio>

#include <fmt/format.h>

#include "common/random.h"
#include "retry/backoff_policy.h"
#include "retry/retry_loop.h"
#include "common/strings.h"

namespace spotvisor {

namespace {
using Json = nlohmann::json;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }
}  // namespace

std::string LogName(const std::string& project, const std::string& name) {
  return fmt::format("projects/{}/logs/{}", project, UrlEncode(name));
}

CloudLoggingSink::CloudLoggingSink(CloudLoggingOptions options, std::unique_ptr<TokenProvider> tokens,
                                   std::unique_ptr<HttpClient> http)
    : o_(std::move(options)),
      tokens_(std::move(tokens)),
      http_(std::move(http)),
      insert_prefix_(fmt::format("{:016x}", RandomSeed())),
      thread_([this] { Run(); }) {}

CloudLoggingSink::~CloudLoggingSink() {
  // Owners flush with their own deadline first (Logger::Flush); this is the
  // last, short chance for what came after.
  Flush(std::chrono::seconds(1));
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    if (!queue_.empty()) {
      // Said where it can still be seen: these entries are lost.
      std::fprintf(stderr, "spotvisor: %zu log entries not delivered to Cloud Logging before exit\n", queue_.size());
    }
  }
  cv_.notify_all();
  sleeper_.Cancel();
  http_->Cancel();
  thread_.join();
}

std::vector<Json> CloudLoggingSink::MakeEntries(const LogEvent& e, WallTime time,
                                                const std::map<std::string, std::string>& labels) const {
  bool trainer = e.event == "trainer.output";
  Json payload = {{"message", e.message}, {"event", e.event}};
  for (auto const& [k, v] : e.fields.items()) payload[k] = v;
  Json l = Json::object();
  for (auto const& [k, v] : o_.labels) l[k] = v;
  for (auto const& [k, v] : labels) l[k] = v;
  Json entry = {{"logName", LogName(o_.project_id, trainer ? "spotvisor-trainer" : "spotvisor")},
                {"timestamp", FormatRfc3339(time)},
                {"severity", SeverityName(e.severity)},
                {"labels", l},
                {"jsonPayload", payload}};
  // Cheap estimate first: only an entry that might be too big is serialised here.
  auto id = fmt::format("{}-{}", insert_prefix_, ++next_insert_);
  entry["insertId"] = id;
  std::size_t estimate = e.message.size() + 1024;
  for (auto const& [k, v] : e.fields.items()) estimate += k.size() + (v.is_string() ? v.get_ref<const std::string&>().size() : Dump(v).size());
  if (estimate <= o_.max_entry_bytes / 2) return {std::move(entry)};
  auto size = Dump(entry).size();
  if (size <= o_.max_entry_bytes) return {std::move(entry)};
  // The API rejects entries above ~256 KB whole: split the message instead.
  std::size_t overhead = size - Dump(Json(e.message)).size() + 64;
  std::size_t room = o_.max_entry_bytes > overhead + 1024 ? o_.max_entry_bytes - overhead : 1024;
  room = room * 3 / 4;  // escaping can grow the text (\uXXXX for control characters)
  std::vector<std::string> parts;
  for (std::size_t at = 0; at < e.message.size();) {
    std::size_t n = std::min(room, e.message.size() - at);
    // Never cut inside a UTF-8 sequence.
    while (n > 0 && at + n < e.message.size() && (static_cast<unsigned char>(e.message[at + n]) & 0xC0) == 0x80) --n;
    if (n == 0) n = std::min(room, e.message.size() - at);
    parts.push_back(e.message.substr(at, n));
    at += n;
  }
  std::vector<Json> out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    Json part = entry;
    part["jsonPayload"]["message"] = parts[i];
    part["jsonPayload"]["part"] = i + 1;
    part["jsonPayload"]["parts"] = parts.size();
    part["insertId"] = fmt::format("{}.{}", id, i + 1);
    out.push_back(std::move(part));
  }
  return out;
}

void CloudLoggingSink::Write(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels) {
  {
    std::lock_guard lk(mu_);
    if (IsDroppable(e) && queue_.size() >= o_.max_queued) {
      ++counters_.dropped;
      ++unreported_drops_;
      return;
    }
    if (unreported_drops_ > 0) {
      // The notice goes where the gap is.
      queue_.push_back(Queued{LogEvent{Severity::kWarning, "log.dropped",
                                       fmt::format("{} trainer output line(s) not sent to Cloud Logging: they came faster "
                                                   "than they could be sent",
                                                   unreported_drops_),
                                       {{"dropped", unreported_drops_}}},
                              time, labels});
      unreported_drops_ = 0;
    }
    queue_.push_back(Queued{e, time, labels});
  }
  cv_.notify_one();
}

void CloudLoggingSink::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  flush_requested_ = true;
  cv_.notify_all();
  idle_.wait_for(lk, timeout, [this] { return queue_.empty() && !sending_; });
  flush_requested_ = false;
}

CloudLoggingSink::Counters CloudLoggingSink::counters() const {
  std::lock_guard lk(mu_);
  return counters_;
}

void CloudLoggingSink::Run() {
  std::unique_lock lk(mu_);
  std::vector<std::string> batch;
  std::size_t bytes = 0;
  for (;;) {
    // A batch goes when it is full, when asked to flush, or batch_delay
    // after its first entry arrived.
    cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_ && queue_.empty()) return;
    cv_.wait_for(lk, o_.batch_delay, [this] {
      return stopping_ || flush_requested_ || queue_.size() >= o_.batch_entries;
    });
    sending_ = true;
    while (!queue_.empty() && batch.size() < o_.batch_entries && bytes < o_.batch_bytes) {
      Queued q = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      for (auto const& entry : MakeEntries(q.event, q.time, q.labels)) {
        batch.push_back(Dump(entry));
        bytes += batch.back().size();
      }
      lk.lock();
    }
    lk.unlock();
    bool ok = SendBatch(batch);
    lk.lock();
    batch.clear();
    bytes = 0;
    sending_ = false;
    if (!ok) ++counters_.failed_batches;
    if (queue_.empty()) idle_.notify_all();
  }
}

bool CloudLoggingSink::SendBatch(const std::vector<std::string>& entries) {
  std::size_t n = entries.size();
  Json resource = {{"type", "gce_instance"},
                   {"labels", {{"project_id", o_.project_id}, {"instance_id", o_.instance_id}, {"zone", o_.zone}}}};
  HttpRequest req;
  req.method = "POST";
  req.url = o_.endpoint + "/v2/entries:write";
  req.body = "{\"resource\":" + Dump(resource) + ",\"partialSuccess\":true,\"entries\":[";
  for (std::size_t i = 0; i < n; ++i) {
    if (i) req.body += ',';
    req.body += entries[i];
  }
  req.body += "]}";
  req.timeout = std::chrono::seconds(30);
  ExponentialBackoffPolicy backoff(std::chrono::milliseconds(250), std::chrono::seconds(8), 2.0);
  LimitedTimeRetryPolicy retry(o_.retry_budget, clock_);
  std::string problem;
  // Every entry carries an insertId: a batch resent after a lost answer is
  // deduplicated by Cloud Logging, so repeating it is safe.
  auto sent = RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper_, [&]() -> Status {
    auto auth = tokens_->AuthorizationHeader();
    if (!auth.ok()) {
      problem = auth.status().message();
      return UnavailableError(problem);  // the token server may be back soon: as before, within the budget
    }
    req.headers = {{"Content-Type", "application/json"}};
    if (!auth->empty()) req.headers.emplace_back("Authorization", *auth);
    auto r = http_->Perform(req);
    {
      std::lock_guard lk(mu_);
      ++counters_.requests;
    }
    if (r.ok() && r->status == 200) return OkStatus();
    problem = r.ok() ? fmt::format("HTTP {}: {:.200}", r->status, r->body) : r.status().message();
    if (!r.ok()) return r.status();
    // 400 (bad entry), 403 (no logging.write scope): retrying will not help.
    if (r->status == 429 || r->status >= 500) return UnavailableError(problem);
    return InvalidArgumentError(problem);
  });
  if (sent.ok()) {
    std::lock_guard lk(mu_);
    counters_.sent += n;
    return true;
  }
  // spotvisor's own logs cannot report that they failed; stderr (journald)
  // can, once per kind of problem.
  std::lock_guard lk(mu_);
  counters_.dropped += n;
  if (problem != stderr_note_) {
    stderr_note_ = problem;
    std::fprintf(stderr, "spotvisor: %zu log entries not delivered to Cloud Logging: %s\n", n, problem.c_str());
  }
  return false;
}

}  // namespace spotvisor
