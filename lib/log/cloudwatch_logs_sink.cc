#include "log/cloudwatch_logs_sink.h"

#include <algorithm>
#include <cstdlib>
#include <strings.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "output/utf8.h"
#include "retry/backoff_policy.h"
#include "retry/retry_loop.h"
#include "storage/sigv4.h"

namespace spotvisor {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

template <typename J>
std::string Dump(const J& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

constexpr std::size_t kEventOverhead = 26;  // what the API adds to each message's size

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::int64_t Millis(WallTime t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// "com.amazonaws.logs#ResourceNotFoundException" or "ResourceNotFoundException".
std::string ErrorType(const HttpResponse& r) {
  std::string type;
  auto j = Json::parse(r.body, nullptr, false);
  if (j.is_object()) {
    auto t = j.find("__type");
    if (t != j.end() && t->is_string()) type = t->get<std::string>();
  }
  if (type.empty()) {
    for (auto const& [k, v] : r.headers) {
      if (k.size() == 16 && strcasecmp(k.c_str(), "x-amzn-ErrorType") == 0) type = v.substr(0, v.find(':'));
    }
  }
  if (auto hash = type.rfind('#'); hash != std::string::npos) type = type.substr(hash + 1);
  return output::EscapeInvalidUtf8(type.substr(0, 100));
}

std::string ErrorMessage(const HttpResponse& r) {
  auto j = Json::parse(r.body, nullptr, false);
  std::string m;
  if (j.is_object()) {
    for (const char* k : {"message", "Message"}) {
      auto t = j.find(k);
      if (t != j.end() && t->is_string()) m = t->get<std::string>();
    }
  }
  return output::EscapeInvalidUtf8(m.substr(0, 300));
}

}  // namespace

std::string CloudWatchLogsEndpoint(const std::string& region) {
  std::string endpoint = Env("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = fmt::format("https://logs.{}.amazonaws.com", region);
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return endpoint;
}

CloudWatchLogsSink::CloudWatchLogsSink(CloudWatchLogsOptions options, std::unique_ptr<AwsCredentialProvider> credentials,
                                       std::unique_ptr<HttpClient> http, const Clock& clock)
    : BatchingSink(Limits{options.max_queued, std::min<std::size_t>(options.batch_entries, 10'000),
                          options.batch_bytes, options.batch_delay},
                   "CloudWatch Logs"),
      o_(std::move(options)),
      creds_(std::move(credentials)),
      http_(std::move(http)),
      clock_(clock) {
  Start();
}

CloudWatchLogsSink::~CloudWatchLogsSink() { Stop(); }

void CloudWatchLogsSink::Interrupt() {
  sleeper_.Cancel();
  cancel_->Cancel();
  http_->Cancel();
}

std::string CloudWatchLogsSink::StreamName(bool trainer) const {
  return o_.instance_id + (trainer ? "/spotvisor-trainer" : "/spotvisor");
}

std::vector<std::string> CloudWatchLogsSink::MakeMessages(const LogEvent& e, WallTime time,
                                                          const std::map<std::string, std::string>& labels) const {
  const std::size_t max = o_.max_event_bytes > kEventOverhead + 64 ? o_.max_event_bytes - kEventOverhead : 64;
  if (e.event == "trainer.output") {
    // The API refuses empty messages; an empty line stays a line.
    if (e.message.empty()) return {" "};
    if (e.message.size() <= max) return {e.message};
    return SplitUtf8(e.message, max);
  }
  OrderedJson j = OrderedJson::object();
  j["severity"] = SeverityName(e.severity);
  j["message"] = e.message;
  j["event"] = e.event;
  j["time"] = FormatRfc3339(time);
  Json l = Json::object();
  for (auto const& [k, v] : o_.labels) l[k] = v;
  for (auto const& [k, v] : labels) l[k] = v;
  if (!l.empty()) j["labels"] = l;
  for (auto const& [k, v] : e.fields.items()) j[k] = v;
  std::string whole = Dump(j);
  if (whole.size() <= max) return {whole};
  // Too big for one event: the message in parts, each part with the
  // event's other fields (as on Cloud Logging).
  std::size_t overhead = whole.size() - Dump(Json(e.message)).size() + 64;
  std::size_t room = max > overhead + 1024 ? (max - overhead) * 3 / 4 : 1024;  // escaping can grow the text
  auto parts = SplitUtf8(e.message, room);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    OrderedJson p = j;
    p["message"] = parts[i];
    p["part"] = i + 1;
    p["parts"] = parts.size();
    std::string s = Dump(p);
    if (s.size() <= max) {
      out.push_back(std::move(s));
    } else {
      // The other fields alone are too big: raw pieces, nothing lost.
      for (auto& piece : SplitUtf8(s, max)) out.push_back(std::move(piece));
    }
  }
  return out;
}

void CloudWatchLogsSink::Encode(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels,
                                std::vector<Entry>& out) {
  bool trainer = e.event == "trainer.output";
  for (auto& m : MakeMessages(e, time, labels)) {
    Entry x;
    x.bytes = m.size() + kEventOverhead;
    x.channel = trainer ? 1 : 0;
    x.time_ms = Millis(time);
    x.body = fmt::format("{{\"timestamp\":{},\"message\":{}}}", x.time_ms, Dump(Json(std::move(m))));
    out.push_back(std::move(x));
  }
}

StatusOr<HttpResponse> CloudWatchLogsSink::Call(const std::string& target, const std::string& body, std::string& type,
                                                bool& token_retried) {
  CallContext ctx;
  ctx.cancel = cancel_;
  ctx.clock = &clock_;
  ctx.deadline = clock_.Now() + std::chrono::seconds(30);
  auto creds = creds_->Get(ctx);
  if (!creds.ok()) return creds.status();
  HttpRequest req;
  req.method = "POST";
  req.url = o_.endpoint + "/";
  req.timeout = std::chrono::seconds(30);
  req.body = body;
  req.headers = {{"Content-Type", "application/x-amz-json-1.1"}, {"X-Amz-Target", "Logs_20140328." + target}};
  if (auto s = SignV4(req, *creds, o_.region, "logs", Sha256Hex(req.body), clock_.WallNow()); !s.ok()) return s;
  auto r = http_->Perform(req);
  CountRequest();
  if (!r.ok()) return r.status();
  type = r->status == 200 ? "" : ErrorType(*r);
  std::string server = fmt::format("{} HTTP {} {}: {}", target, r->status, type, ErrorMessage(*r));
  if (r->status == 200) return r;
  if ((type == "ExpiredTokenException" || type == "ExpiredToken") && !token_retried) {
    creds_->Invalidate();
    token_retried = true;
    return UnavailableError(server + "; fetching the credentials again");
  }
  if (type == "AccessDeniedException" || r->status == 403) {
    return PermissionDeniedError(fmt::format("{}. The credentials ({}) need logs:{} on log group {}", server,
                                             creds_->Source(), target, o_.log_group));
  }
  if (type == "UnrecognizedClientException" || type == "InvalidSignatureException") {
    return PermissionDeniedError(fmt::format("{}: CloudWatch Logs refused the credentials from the {}", server,
                                             creds_->Source()));
  }
  if (type == "ThrottlingException" || type == "ServiceUnavailableException" || r->status == 429 || r->status >= 500) {
    return UnavailableError(server);
  }
  if (type == "ResourceNotFoundException" || type == "ResourceAlreadyExistsException") return r;  // the caller decides
  return InvalidArgumentError(server);
}

// CreateLogStream, and CreateLogGroup first if the group is not there; one
// that exists already is what we wanted.
Status CloudWatchLogsSink::EnsureStream(int channel, std::string& problem) {
  if (stream_ready_[channel]) return OkStatus();
  std::string stream = Dump(Json(StreamName(channel == 1)));
  std::string group = Dump(Json(o_.log_group));
  bool token_retried = false;
  for (int round = 0; round < 2; ++round) {
    std::string type;
    auto r = Call("CreateLogStream", "{\"logGroupName\":" + group + ",\"logStreamName\":" + stream + "}", type,
                  token_retried);
    if (!r.ok()) {
      problem = r.status().message();
      return r.status();
    }
    if (r->status == 200 || type == "ResourceAlreadyExistsException") {
      stream_ready_[channel] = true;
      return OkStatus();
    }
    // ResourceNotFoundException: no such group yet.
    auto g = Call("CreateLogGroup", "{\"logGroupName\":" + group + "}", type, token_retried);
    if (!g.ok()) {
      problem = g.status().message();
      return g.status();
    }
  }
  problem = fmt::format("log group {} is still not there after creating it", o_.log_group);
  return UnavailableError(problem);
}

BatchingSink::SendResult CloudWatchLogsSink::Send(std::vector<Entry>& batch) {
  SendResult result;
  for (int channel : {0, 1}) {
    std::vector<const Entry*> events;
    for (auto const& e : batch) {
      if (e.channel == channel) events.push_back(&e);
    }
    if (events.empty()) continue;
    // The API wants each request's events in chronological order; events
    // logged from different threads can arrive a little out of it.
    std::stable_sort(events.begin(), events.end(), [](const Entry* a, const Entry* b) { return a->time_ms < b->time_ms; });
    std::string body = "{\"logGroupName\":" + Dump(Json(o_.log_group)) +
                       ",\"logStreamName\":" + Dump(Json(StreamName(channel == 1))) + ",\"logEvents\":[";
    for (std::size_t i = 0; i < events.size(); ++i) {
      if (i) body += ',';
      body += events[i]->body;
    }
    body += "]}";
    ExponentialBackoffPolicy backoff(std::chrono::milliseconds(250), std::chrono::seconds(8), 2.0);
    LimitedTimeRetryPolicy retry(o_.retry_budget, clock_);
    std::string problem;
    Status last;
    bool token_retried = false;
    std::size_t rejected = 0;
    auto sent = RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper_, [&]() -> Status {
      if (auto s = EnsureStream(channel, problem); !s.ok()) return last = s;
      std::string type;
      auto r = Call("PutLogEvents", body, type, token_retried);
      if (!r.ok()) {
        problem = r.status().message();
        return last = r.status();
      }
      if (r->status != 200) {
        // The stream or the group was deleted under us: create it again.
        stream_ready_[channel] = false;
        problem = fmt::format("PutLogEvents: {} ({})", type, ErrorMessage(*r));
        return UnavailableError(problem);
      }
      // Events outside the API's window (more than 14 days old or 2 hours
      // ahead: a clock far off) are refused one by one, the rest kept.
      auto j = Json::parse(r->body, nullptr, false);
      if (j.is_object() && j.contains("rejectedLogEventsInfo") && j["rejectedLogEventsInfo"].is_object()) {
        auto const& info = j["rejectedLogEventsInfo"];
        auto index = [&](const char* k) -> std::int64_t {
          auto it = info.find(k);
          return it != info.end() && it->is_number_integer() ? it->get<std::int64_t>() : -1;
        };
        auto n = static_cast<std::int64_t>(events.size());
        std::int64_t too_new = index("tooNewLogEventStartIndex"), too_old = index("tooOldLogEventEndIndex"),
                     expired = index("expiredLogEventEndIndex");
        std::int64_t refused = 0;
        if (too_new >= 0 && too_new < n) refused += n - too_new;
        std::int64_t old_end = std::max(too_old, expired);
        if (old_end >= 0) refused += std::min(old_end, n);  // the end index is exclusive
        rejected = static_cast<std::size_t>(std::min(refused, n));
        if (rejected > 0) {
          problem = fmt::format("CloudWatch Logs refused {} event(s) as too old or too far ahead (is the clock right?)",
                                rejected);
        }
      }
      return OkStatus();
    });
    if (sent.ok()) {
      result.sent += events.size() - rejected;
      result.failed += rejected;
    } else {
      result.failed += events.size();
    }
    if (!problem.empty() && (rejected > 0 || !sent.ok())) {
      result.problem = problem;
      // The server's words name the stream; the same refusal on both streams is one problem.
      result.problem_kind = rejected > 0 ? "rejected"
                                         : fmt::format("{} {}", static_cast<int>(last.code()),
                                                       problem.substr(0, problem.find(' ')));
    }
  }
  return result;
}

}  // namespace spotvisor
