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
    : BatchingSink(Limits{options.max_queued, options.batch_entries, options.batch_bytes, options.batch_delay},
                   "Cloud Logging"),
      o_(std::move(options)),
      tokens_(std::move(tokens)),
      http_(std::move(http)),
      insert_prefix_(fmt::format("{:016x}", RandomSeed())) {
  Start();
}

CloudLoggingSink::~CloudLoggingSink() { Stop(); }

void CloudLoggingSink::Interrupt() {
  sleeper_.Cancel();
  http_->Cancel();
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
  auto parts = SplitUtf8(e.message, room);
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

void CloudLoggingSink::Encode(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels,
                              std::vector<Entry>& out) {
  for (auto const& entry : MakeEntries(e, time, labels)) {
    Entry x;
    x.body = Dump(entry);
    x.bytes = x.body.size();
    out.push_back(std::move(x));
  }
}

BatchingSink::SendResult CloudLoggingSink::Send(std::vector<Entry>& entries) {
  std::size_t n = entries.size();
  Json resource = {{"type", "gce_instance"},
                   {"labels", {{"project_id", o_.project_id}, {"instance_id", o_.instance_id}, {"zone", o_.zone}}}};
  HttpRequest req;
  req.method = "POST";
  req.url = o_.endpoint + "/v2/entries:write";
  req.body = "{\"resource\":" + Dump(resource) + ",\"partialSuccess\":true,\"entries\":[";
  for (std::size_t i = 0; i < n; ++i) {
    if (i) req.body += ',';
    req.body += entries[i].body;
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
    CountRequest();
    if (r.ok() && r->status == 200) return OkStatus();
    problem = r.ok() ? fmt::format("HTTP {}: {:.200}", r->status, r->body) : r.status().message();
    if (!r.ok()) return r.status();
    // 400 (bad entry), 403 (no logging.write scope): retrying will not help.
    if (r->status == 429 || r->status >= 500) return UnavailableError(problem);
    return InvalidArgumentError(problem);
  });
  if (sent.ok()) return SendResult{n, 0, "", ""};
  return SendResult{0, n, problem, ""};
}

}  // namespace spotvisor
