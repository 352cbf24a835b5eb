#include "gang/etcd_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <limits>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "output/utf8.h"
#include "retry/backoff_policy.h"
#include "retry/retry_loop.h"
#include "retry/retry_policy.h"
#include "storage/crc32c.h"
#include "storage/transfer.h"

namespace spotvisor {

using json = nlohmann::json;

// What etcd 3.4's gateway (grpc-gateway v1) does, checked against 3.4.23:
// - proto3 JSON: bytes are base64, int64s are strings, and zero values are
//   left out ("succeeded": false, "count": 0, a PUT event's "type", a
//   keep-alive's TTL for a lease that is gone), so absent means zero.
// - Errors: a non-2xx status with {"error":M,"message":M,"code":GRPC_CODE}.
//   Inside a 2xx stream an error is a frame {"error":{"grpc_code",...}}.
// - Streams (watch, lease keep-alive) are one JSON object per message, each
//   followed by "\n", as {"result":{...}}; a keep-alive stream ends with
//   its one request.
// - Auth: the raw token in "Authorization" (no "Bearer"); no token while
//   auth is on is code 3 "user name is empty", a stale one code 16; a
//   watch refused for auth is a created+canceled frame whose cancel_reason
//   is text ("rpc error: code = Unauthenticated desc = ...").
namespace etcd_internal {
namespace {

Status Bad(std::string what) { return InternalError("etcd sent a malformed answer: " + std::move(what)); }

// A proto3 int64 field: absent is 0, a string or a JSON integer is the value.
Status Int(const json& obj, const char* name, std::int64_t& out) {
  out = 0;
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return OkStatus();
  if (it->is_string()) {
    auto v = ParseInt64(it->get_ref<const std::string&>());
    if (!v) return Bad(fmt::format("\"{}\" is not a 64-bit integer", name));
    out = *v;
    return OkStatus();
  }
  if (it->is_number_unsigned()) {
    auto u = it->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return Bad(fmt::format("\"{}\" is out of range", name));
    }
    out = static_cast<std::int64_t>(u);
    return OkStatus();
  }
  if (it->is_number_integer()) {
    out = it->get<std::int64_t>();
    return OkStatus();
  }
  return Bad(fmt::format("\"{}\" is not an integer", name));
}

// A proto3 bytes field: absent is empty, else base64 in a string.
Status Bytes(const json& obj, const char* name, std::string& out) {
  out.clear();
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return OkStatus();
  if (!it->is_string()) return Bad(fmt::format("\"{}\" is not a string", name));
  auto d = Base64Decode(it->get_ref<const std::string&>());
  if (!d.ok()) return Bad(fmt::format("\"{}\" is not base64: {}", name, d.status().message()));
  out = std::move(*d);
  return OkStatus();
}

Status Bool(const json& obj, const char* name, bool& out) {
  out = false;
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return OkStatus();
  if (!it->is_boolean()) return Bad(fmt::format("\"{}\" is not a boolean", name));
  out = it->get<bool>();
  return OkStatus();
}

Status Str(const json& obj, const char* name, std::string& out) {
  out.clear();
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return OkStatus();
  if (!it->is_string()) return Bad(fmt::format("\"{}\" is not a string", name));
  out = it->get<std::string>();
  return OkStatus();
}

// obj[name] as an object (absent: an empty one) or an array (absent: empty).
StatusOr<const json*> Child(const json& obj, const char* name, bool array) {
  static const json kEmptyObject = json::object();
  static const json kEmptyArray = json::array();
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return array ? &kEmptyArray : &kEmptyObject;
  if (array ? !it->is_array() : !it->is_object()) {
    return Bad(fmt::format("\"{}\" is not an {}", name, array ? "array" : "object"));
  }
  return &*it;
}

StatusOr<json> Object(std::string_view body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return Bad("not JSON");
  if (!j.is_object()) return Bad("not a JSON object");
  return j;
}

StatusOr<std::int64_t> HeaderRevision(const json& obj) {
  auto h = Child(obj, "header", false);
  if (!h.ok()) return h.status();
  std::int64_t rev = 0;
  if (auto s = Int(**h, "revision", rev); !s.ok()) return s;
  return rev;
}

StatusOr<EtcdKv> Kv(const json& j) {
  if (!j.is_object()) return Bad("a kv is not an object");
  EtcdKv kv;
  for (auto s : {Bytes(j, "key", kv.key), Bytes(j, "value", kv.value), Int(j, "create_revision", kv.create_revision),
                 Int(j, "mod_revision", kv.mod_revision), Int(j, "version", kv.version), Int(j, "lease", kv.lease)}) {
    if (!s.ok()) return s;
  }
  return kv;
}

StatusOr<std::vector<EtcdKv>> Kvs(const json& obj) {
  auto arr = Child(obj, "kvs", true);
  if (!arr.ok()) return arr.status();
  std::vector<EtcdKv> out;
  for (auto const& e : **arr) {
    auto kv = Kv(e);
    if (!kv.ok()) return kv.status();
    out.push_back(std::move(*kv));
  }
  return out;
}

std::string I64(std::int64_t v) { return std::to_string(v); }

json RangeJson(const std::string& key, const std::string& range_end) {
  json j = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) j["range_end"] = Base64Encode(range_end);
  return j;
}

json OpJson(const EtcdOp& op) {
  switch (op.kind) {
    case EtcdOp::kPut: {
      json p = {{"key", Base64Encode(op.key)}, {"value", Base64Encode(op.value)}};
      if (op.lease != 0) p["lease"] = I64(op.lease);
      return {{"request_put", p}};
    }
    case EtcdOp::kDelete: return {{"request_delete_range", RangeJson(op.key, op.range_end)}};
    case EtcdOp::kRange: break;
  }
  return {{"request_range", RangeJson(op.key, op.range_end)}};
}

json CompareJson(const EtcdCompare& c) {
  static constexpr const char* kResults[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
  json j = {{"key", Base64Encode(c.key)}, {"result", kResults[c.result]}};
  switch (c.target) {
    case EtcdCompare::kVersion: j["target"] = "VERSION"; j["version"] = I64(c.number); break;
    case EtcdCompare::kCreate: j["target"] = "CREATE"; j["create_revision"] = I64(c.number); break;
    case EtcdCompare::kMod: j["target"] = "MOD"; j["mod_revision"] = I64(c.number); break;
    case EtcdCompare::kValue: j["target"] = "VALUE"; j["value"] = Base64Encode(c.value); break;
    case EtcdCompare::kLease: j["target"] = "LEASE"; j["lease"] = I64(c.number); break;
  }
  return j;
}

}  // namespace

std::optional<std::int64_t> ParseInt64(std::string_view s) {
  bool neg = !s.empty() && s.front() == '-';
  if (neg) s.remove_prefix(1);
  if (s.empty() || s.size() > 19) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');  // 19 digits cannot overflow 64 bits
  }
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (neg) {
    if (v > kMax + 1) return std::nullopt;
    return v == kMax + 1 ? std::numeric_limits<std::int64_t>::min() : -static_cast<std::int64_t>(v);
  }
  if (v > kMax) return std::nullopt;
  return static_cast<std::int64_t>(v);
}

std::string RangeBody(const std::string& key, const std::string& range_end) { return RangeJson(key, range_end).dump(); }

std::string PutBody(const std::string& key, const std::string& value, std::int64_t lease) {
  json j = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) j["lease"] = I64(lease);
  return j.dump();
}

std::string DeleteBody(const std::string& key, const std::string& range_end) { return RangeBody(key, range_end); }

std::string TxnBody(const std::vector<EtcdCompare>& compare, const std::vector<EtcdOp>& success,
                    const std::vector<EtcdOp>& failure) {
  json j = {{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (auto const& c : compare) j["compare"].push_back(CompareJson(c));
  for (auto const& op : success) j["success"].push_back(OpJson(op));
  for (auto const& op : failure) j["failure"].push_back(OpJson(op));
  return j.dump();
}

std::string WatchBody(const std::string& key, const std::string& range_end, std::int64_t start_revision) {
  json c = RangeJson(key, range_end);
  if (start_revision > 0) c["start_revision"] = I64(start_revision);
  return json{{"create_request", c}}.dump();
}

StatusOr<std::pair<std::vector<EtcdKv>, std::int64_t>> ParseRange(std::string_view body) {
  auto j = Object(body);
  if (!j.ok()) return j.status();
  auto rev = HeaderRevision(*j);
  if (!rev.ok()) return rev.status();
  auto kvs = Kvs(*j);
  if (!kvs.ok()) return kvs.status();
  return std::make_pair(std::move(*kvs), *rev);
}

StatusOr<std::int64_t> ParsePut(std::string_view body) {
  auto j = Object(body);
  if (!j.ok()) return j.status();
  auto rev = HeaderRevision(*j);
  if (!rev.ok()) return rev.status();
  if (*rev <= 0) return Bad("a put without a revision");
  return *rev;
}

StatusOr<std::int64_t> ParseDelete(std::string_view body) {
  auto j = Object(body);
  if (!j.ok()) return j.status();
  std::int64_t deleted = 0;
  if (auto s = Int(*j, "deleted", deleted); !s.ok()) return s;
  if (deleted < 0) return Bad("a negative deleted count");
  return deleted;
}

StatusOr<EtcdTxnResult> ParseTxn(std::string_view body) {
  auto j = Object(body);
  if (!j.ok()) return j.status();
  EtcdTxnResult t;
  auto rev = HeaderRevision(*j);
  if (!rev.ok()) return rev.status();
  t.revision = *rev;
  if (auto s = Bool(*j, "succeeded", t.succeeded); !s.ok()) return s;
  auto responses = Child(*j, "responses", true);
  if (!responses.ok()) return responses.status();
  for (auto const& r : **responses) {
    if (!r.is_object()) return Bad("a txn response is not an object");
    auto it = r.find("response_range");
    if (it == r.end()) continue;
    if (!it->is_object()) return Bad("\"response_range\" is not an object");
    auto kvs = Kvs(*it);
    if (!kvs.ok()) return kvs.status();
    t.ranges.push_back(std::move(*kvs));
  }
  return t;
}

StatusOr<std::pair<std::int64_t, std::int64_t>> ParseLeaseGrant(std::string_view body) {
  auto j = Object(body);
  if (!j.ok()) return j.status();
  std::int64_t id = 0, ttl = 0;
  std::string error;
  for (auto s : {Int(*j, "ID", id), Int(*j, "TTL", ttl), Str(*j, "error", error)}) {
    if (!s.ok()) return s;
  }
  if (!error.empty()) return UnavailableError("etcd refused the lease: " + output::EscapeInvalidUtf8(error.substr(0, 300)));
  if (id == 0 || ttl <= 0) return Bad("a lease without an ID or a TTL");
  return std::make_pair(id, ttl);
}

StatusOr<std::int64_t> ParseLeaseKeepAlive(std::string_view body) {
  // One request, one frame; the stream ends with the request.
  auto nl = body.find('\n');
  auto j = Object(body.substr(0, nl));
  if (!j.ok()) return j.status();
  auto result = j->find("result");
  if (result == j->end() || !result->is_object()) return Bad("a keep-alive frame without a result");
  std::int64_t ttl = 0;
  if (auto s = Int(*result, "TTL", ttl); !s.ok()) return s;
  return ttl > 0 ? ttl : -1;  // no TTL: the lease is gone
}

StatusOr<std::int64_t> ParseLeaseTimeToLive(std::string_view body) {
  auto j = Object(body);
  if (!j.ok()) return j.status();
  std::int64_t ttl = 0;
  if (auto s = Int(*j, "TTL", ttl); !s.ok()) return s;
  return ttl > 0 ? ttl : -1;
}

StatusOr<std::string> ParseAuthenticate(std::string_view body) {
  auto j = Object(body);
  if (!j.ok()) return j.status();
  std::string token;
  if (auto s = Str(*j, "token", token); !s.ok()) return s;
  if (token.empty()) return Bad("no token in the authenticate answer (is auth enabled on etcd?)");
  // It goes into a header line: no control characters.
  if (std::any_of(token.begin(), token.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; })) {
    return Bad("the token has control characters");
  }
  return token;
}

EtcdError ParseError(long http_status, std::string_view body) {
  EtcdError e;
  json j = json::parse(body.substr(0, body.find('\n')), nullptr, false);
  const json* src = nullptr;
  const char* code_name = "code";
  if (j.is_object()) {
    auto err = j.find("error");
    if (err != j.end() && err->is_object()) {  // a streamed error frame
      src = &*err;
      code_name = "grpc_code";
    } else if (j.contains("code")) {
      src = &j;
    }
  }
  if (src) {
    std::int64_t code = -1;
    std::string message;
    if (Int(*src, code_name, code).ok() && code >= 0 && code <= 16) {
      e.grpc_code = static_cast<int>(code);
      if (!Str(*src, "message", message).ok() || message.empty()) (void)Str(*src, "error", message);
      e.message = output::EscapeInvalidUtf8(message.substr(0, 300));
      return e;
    }
  }
  e.message = fmt::format("HTTP {}: {}", http_status,
                          output::EscapeInvalidUtf8(std::string(body.substr(0, std::min<std::size_t>(body.size(), 200)))));
  return e;
}

StatusCode StatusFromGrpc(int grpc_code) {
  switch (grpc_code) {
    case 0: return StatusCode::kOk;
    case 3: return StatusCode::kInvalidArgument;         // InvalidArgument
    case 4: return StatusCode::kDeadlineExceeded;        // DeadlineExceeded
    case 5: return StatusCode::kNotFound;                // NotFound
    case 6: return StatusCode::kFailedPrecondition;      // AlreadyExists
    case 7: return StatusCode::kPermissionDenied;        // PermissionDenied
    case 9: return StatusCode::kFailedPrecondition;      // FailedPrecondition
    case 11: return StatusCode::kFailedPrecondition;     // OutOfRange (compacted): no kOutOfRange yet
    case 12: return StatusCode::kInvalidArgument;        // Unimplemented
    case 13: case 15: return StatusCode::kInternal;      // Internal, DataLoss
    case 16: return StatusCode::kPermissionDenied;       // Unauthenticated
    // Cancelled (by the server: a leader change), Unknown, ResourceExhausted
    // (too many requests), Aborted, Unavailable: worth trying again.
    default: return StatusCode::kUnavailable;
  }
}

StatusOr<WatchFrame> ParseWatchFrame(std::string_view line) {
  auto j = Object(line);
  if (!j.ok()) return j.status();
  WatchFrame f;
  auto result = j->find("result");
  if (result == j->end()) {
    f.error = ParseError(200, line);
    if (f.error.grpc_code < 0) return Bad("a watch frame with neither a result nor an error");
    return f;
  }
  if (!result->is_object()) return Bad("a watch result is not an object");
  auto rev = HeaderRevision(*result);
  if (!rev.ok()) return rev.status();
  f.revision = *rev;
  for (auto s : {Bool(*result, "created", f.created), Bool(*result, "canceled", f.canceled),
                 Int(*result, "compact_revision", f.compact_revision), Str(*result, "cancel_reason", f.cancel_reason)}) {
    if (!s.ok()) return s;
  }
  auto events = Child(*result, "events", true);
  if (!events.ok()) return events.status();
  for (auto const& e : **events) {
    if (!e.is_object()) return Bad("a watch event is not an object");
    std::string type;
    if (auto s = Str(e, "type", type); !s.ok()) return s;
    EtcdEvent ev{EtcdEvent::kPut, {}};
    if (type == "DELETE") {
      ev.type = EtcdEvent::kDelete;
    } else if (!type.empty() && type != "PUT") {
      return Bad("an unknown watch event type");
    }
    auto kv = Child(e, "kv", false);
    if (!kv.ok()) return kv.status();
    auto parsed = Kv(**kv);
    if (!parsed.ok()) return parsed.status();
    ev.kv = std::move(*parsed);
    f.events.push_back(std::move(ev));
  }
  return f;
}

bool FrameSplitter::Feed(std::string_view data, const std::function<bool(std::string_view)>& on_frame) {
  while (!data.empty()) {
    auto nl = data.find('\n');
    std::string_view piece = data.substr(0, nl);
    if (buf_.size() + piece.size() > max_frame_) return false;
    if (nl == std::string_view::npos) {
      buf_.append(piece);
      return true;
    }
    data.remove_prefix(nl + 1);
    std::string_view frame = piece;
    if (!buf_.empty()) {
      buf_.append(piece);
      frame = buf_;
    }
    bool keep = true;
    if (!Trim(frame).empty()) keep = on_frame(frame);
    buf_.clear();
    if (!keep) return false;
  }
  return true;
}

}  // namespace etcd_internal

std::optional<std::int64_t> EtcdCompactRevision(const Status& s) {
  static constexpr std::string_view kMarker = "compacted at revision ";
  if (s.code() != kEtcdCompacted) return std::nullopt;
  auto at = s.message().find(kMarker);
  if (at == std::string::npos) return std::nullopt;
  auto digits = std::string_view(s.message()).substr(at + kMarker.size());
  std::size_t n = 0;
  while (n < digits.size() && digits[n] >= '0' && digits[n] <= '9') ++n;
  return etcd_internal::ParseInt64(digits.substr(0, n));
}

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

namespace {

using namespace etcd_internal;  // NOLINT: this file's own helpers

constexpr std::size_t kMaxWatchFrame = 64u << 20;

// True when a transport failure happened before the request could reach
// etcd, so even a write may be sent to the next endpoint.
bool NeverSent(const Status& s) {
  for (CURLcode c : {CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY,
                     CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM,
                     CURLE_SSL_CACERT_BADFILE}) {
    if (s.message().find(curl_easy_strerror(c)) != std::string::npos) return true;
  }
  // libcurl's connect timeout ("Connection timed out after N ms"), not the
  // transfer's ("Operation timed out").
  return s.message().find("Connection timed out after") != std::string::npos;
}

// etcd's TLS refused our client certificate (or got none). With TLS 1.3
// the alert arrives after the handshake, so libcurl reports a failed send
// or read: the request was never processed, and no retry will fix it.
bool CertificateRefused(const Status& s) {
  return s.message().find("alert bad certificate") != std::string::npos ||
         s.message().find("alert certificate required") != std::string::npos;
}

// The token was refused (expired, or the server restarted: simple tokens
// live in memory) or not sent while auth is on, or the auth store moved on.
bool IsAuthError(const EtcdError& e) {
  return e.grpc_code == 16 || e.message.find("invalid auth token") != std::string::npos ||
         e.message.find("user name is empty") != std::string::npos ||
         e.message.find("revision of auth store is old") != std::string::npos;
}

std::string Quote(std::string_view key) {
  std::string k = output::EscapeInvalidUtf8(key.substr(0, std::min<std::size_t>(key.size(), 100)));
  std::string out = "\"";
  for (char c : k) {
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + (key.size() > 100 ? "...\"" : "\"");
}

std::string RangeName(const std::string& key, const std::string& range_end) {
  if (range_end.empty()) return Quote(key);
  if (range_end == PrefixEnd(key)) return Quote(key) + "*";
  return fmt::format("[{}, {})", Quote(key), Quote(range_end));
}

// Stops the retry loop once `stop` is set (a watch that was established
// and then broke is the caller's to resume, not ours to repeat).
class UnlessPolicy final : public RetryPolicy {
 public:
  UnlessPolicy(std::unique_ptr<RetryPolicy> inner, const bool& stop) : inner_(std::move(inner)), stop_(stop) {}
  bool OnFailure(const Status& s) override { return !stop_ && inner_->OnFailure(s); }
  std::unique_ptr<RetryPolicy> clone() const override { return std::make_unique<UnlessPolicy>(inner_->clone(), stop_); }

 private:
  std::unique_ptr<RetryPolicy> inner_;
  const bool& stop_;
};

class EtcdClientImpl final : public EtcdClient {
 public:
  EtcdClientImpl(EtcdOptions o, Sleeper& sleeper, const Clock& clock,
                 std::function<std::unique_ptr<HttpClient>()> make_http)
      : o_(std::move(o)), sleeper_(sleeper), clock_(clock), http_(std::move(make_http)) {
    for (auto& e : o_.endpoints) {
      if (e.find("://") == std::string::npos) e = "http://" + e;
      while (!e.empty() && e.back() == '/') e.pop_back();
    }
  }

  StatusOr<std::int64_t> LeaseGrant(std::chrono::seconds ttl, const CallContext& ctx) override {
    // A lost answer leaves an unused lease behind that expires by itself:
    // harmless, so the grant is retried like a read.
    auto r = Call(fmt::format("etcd lease grant ({}s)", ttl.count()), "/v3/lease/grant",
                  json{{"TTL", std::to_string(ttl.count())}}.dump(), Idempotency::kIdempotent, ctx);
    if (!r.ok()) return r.status();
    auto g = ParseLeaseGrant(*r);
    if (!g.ok()) return Named("etcd lease grant", g.status());
    return g->first;
  }

  StatusOr<std::chrono::seconds> LeaseKeepAlive(std::int64_t lease, const CallContext& ctx) override {
    std::string what = fmt::format("etcd keep-alive of lease {:x}", lease);
    auto r = Call(what, "/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump(), Idempotency::kIdempotent, ctx);
    if (!r.ok()) return r.status();
    auto ttl = ParseLeaseKeepAlive(*r);
    if (!ttl.ok()) return Named(what, ttl.status());
    if (*ttl < 0) return NotFoundError(what + ": the lease has expired or was revoked");
    return std::chrono::seconds(*ttl);
  }

  StatusOr<std::chrono::seconds> LeaseTimeToLive(std::int64_t lease, const CallContext& ctx) override {
    std::string what = fmt::format("etcd time-to-live of lease {:x}", lease);
    auto r = Call(what, "/v3/lease/timetolive", json{{"ID", std::to_string(lease)}}.dump(), Idempotency::kIdempotent, ctx);
    if (!r.ok()) return r.status();
    auto ttl = ParseLeaseTimeToLive(*r);
    if (!ttl.ok()) return Named(what, ttl.status());
    if (*ttl < 0) return NotFoundError(what + ": the lease has expired or was revoked");
    return std::chrono::seconds(*ttl);
  }

  Status LeaseRevoke(std::int64_t lease, const CallContext& ctx) override {
    // Revoking twice ends in the same state (the second one is kNotFound).
    auto r = Call(fmt::format("etcd revoke of lease {:x}", lease), "/v3/lease/revoke",
                  json{{"ID", std::to_string(lease)}}.dump(), Idempotency::kIdempotent, ctx);
    return r.status();
  }

  StatusOr<std::int64_t> Put(const std::string& key, const std::string& value, std::int64_t lease,
                             const CallContext& ctx) override {
    std::string what = "etcd put " + Quote(key);
    auto r = Call(what, "/v3/kv/put", PutBody(key, value, lease), Idempotency::kNonIdempotent, ctx);
    if (!r.ok()) return r.status();
    auto rev = ParsePut(*r);
    if (!rev.ok()) return Named(what, rev.status());
    return *rev;
  }

  StatusOr<std::pair<std::vector<EtcdKv>, std::int64_t>> Range(const std::string& key, const std::string& range_end,
                                                               const CallContext& ctx) override {
    std::string what = "etcd range " + RangeName(key, range_end);
    auto r = Call(what, "/v3/kv/range", RangeBody(key, range_end), Idempotency::kIdempotent, ctx);
    if (!r.ok()) return r.status();
    auto kvs = ParseRange(*r);
    if (!kvs.ok()) return Named(what, kvs.status());
    return kvs;
  }

  StatusOr<std::int64_t> Delete(const std::string& key, const std::string& range_end, const CallContext& ctx) override {
    std::string what = "etcd delete " + RangeName(key, range_end);
    auto r = Call(what, "/v3/kv/deleterange", DeleteBody(key, range_end), Idempotency::kNonIdempotent, ctx);
    if (!r.ok()) return r.status();
    auto n = ParseDelete(*r);
    if (!n.ok()) return Named(what, n.status());
    return n;
  }

  StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compare, const std::vector<EtcdOp>& success,
                              const std::vector<EtcdOp>& failure, const CallContext& ctx) override {
    std::string what = "etcd txn";
    if (!compare.empty()) what += " on " + Quote(compare.front().key);
    auto r = Call(what, "/v3/kv/txn", TxnBody(compare, success, failure), Idempotency::kNonIdempotent, ctx);
    if (!r.ok()) return r.status();
    auto t = ParseTxn(*r);
    if (!t.ok()) return Named(what, t.status());
    return t;
  }

  Status Watch(const std::string& key, const std::string& range_end, std::int64_t start_revision,
               const std::function<void(const std::vector<EtcdEvent>&, std::int64_t)>& on_events,
               const CallContext& ctx) override {
    std::string what = "etcd watch " + RangeName(key, range_end);
    std::string body = WatchBody(key, range_end, start_revision);
    bool established = false;
    std::int64_t last_revision = start_revision > 0 ? start_revision - 1 : 0;
    auto attempt = [&](const std::string& endpoint, const std::string& token, Status& stream_status) {
      FrameSplitter splitter(kMaxWatchFrame);
      HttpRequest req = Request(endpoint, "/v3/watch", body, token);
      // The stream lasts as long as the caller wants (Send clamps this to
      // the context's deadline); only connecting is bounded by our timeout.
      req.timeout = ctx.deadline ? std::chrono::hours(24 * 365) : std::chrono::milliseconds(0);
      req.on_body = [&](std::string_view data) {
        bool ok = splitter.Feed(data, [&](std::string_view line) {
          auto f = ParseWatchFrame(line);
          if (!f.ok()) {
            stream_status = Named(what + ": " + endpoint, f.status());
            return false;
          }
          if (f->error.grpc_code >= 0) {
            stream_status = Named(what + ": " + endpoint, {StatusFromGrpc(f->error.grpc_code), f->error.message});
            return false;
          }
          if (f->canceled) {
            stream_status = Named(what + ": " + endpoint, Canceled(*f));
            return false;
          }
          if (f->created) {
            established = true;
            // From "now": everything up to the creation's revision is known.
            if (start_revision <= 0) last_revision = f->revision;
            on_events({}, f->revision);
          }
          if (!f->events.empty()) {
            last_revision = f->events.back().kv.mod_revision;
            on_events(f->events, f->revision);
          }
          return true;
        });
        if (!ok && stream_status.ok()) {
          stream_status = InternalError(fmt::format("{}: {}: a watch frame longer than {} bytes", what, endpoint, kMaxWatchFrame));
        }
        return ok;
      };
      return http_.Send(req, ctx);
    };

    if (o_.endpoints.empty()) return InvalidArgumentError(what + ": no etcd endpoints configured");
    LimitedErrorCountRetryPolicy inner(3);
    UnlessPolicy retry(inner.clone(), established);
    ExponentialBackoffPolicy backoff(std::chrono::milliseconds(100), std::chrono::seconds(1), 2.0);
    ContextSleeper sleeper(ctx, &sleeper_);
    bool reauthed = false;
    Status result = RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [&]() -> Status {
      Status last;
      std::size_t start = Preferred();
      for (std::size_t i = 0; i < o_.endpoints.size(); ++i) {
        if (ctx.cancelled() || ctx.expired()) return OkStatus();
        std::size_t idx = (start + i) % o_.endpoints.size();
        const std::string& endpoint = o_.endpoints[idx];
        auto token = Token(endpoint, Bound(ctx));
        if (!token.ok()) {
          if (token.status().code() == StatusCode::kUnavailable) {
            last = token.status();
            continue;
          }
          return token.status();
        }
        Status stream_status;
        auto r = attempt(endpoint, *token, stream_status);
        if (!stream_status.ok()) {
          if (stream_status.code() == StatusCode::kPermissionDenied && !reauthed && !o_.user.empty()) {
            reauthed = true;
            ForgetToken(*token);
            --i;  // the same endpoint again, with a fresh token
            continue;
          }
          return stream_status;
        }
        if (ctx.cancelled() || ctx.expired()) return OkStatus();
        if (!r.ok()) {
          // The stream's only time limit is the caller's deadline (libcurl's
          // timer may fire a moment before the context's clock says so);
          // connecting has its own.
          if (r.status().code() == StatusCode::kDeadlineExceeded && ctx.deadline && !NeverSent(r.status())) {
            return OkStatus();
          }
          Status s = Named(what, r.status());
          if (CertificateRefused(r.status())) return CertificateError(s);
          if (established) {
            return UnavailableError(fmt::format("{}; the stream broke after revision {}: re-watch from {}", s.message(),
                                                last_revision, last_revision + 1));
          }
          if (r.status().code() == StatusCode::kInvalidArgument) return s;
          last = s;
          continue;
        }
        SetPreferred(idx);
        if (r->status / 100 != 2) {
          auto e = ParseError(r->status, r->body);
          if (IsAuthError(e) && !reauthed && !o_.user.empty()) {
            reauthed = true;
            ForgetToken(*token);
            --i;
            continue;
          }
          Status s = ErrorStatus(what, endpoint, e);
          if (s.code() != StatusCode::kUnavailable) return s;
          last = s;
          continue;
        }
        if (established) {
          return UnavailableError(fmt::format("{}: {}: etcd ended the stream after revision {}: re-watch from {}", what,
                                              endpoint, last_revision, last_revision + 1));
        }
        last = UnavailableError(fmt::format("{}: {}: etcd ended the stream before confirming the watch", what, endpoint));
      }
      return last;
    });
    if (ctx.cancelled() || ctx.expired()) {
      // The caller ended the watch; a compaction seen first is still news.
      if (result.code() == kEtcdCompacted) return result;
      return OkStatus();
    }
    if (result.code() == StatusCode::kCancelled) {
      // The backoff would have run past the deadline: etcd stayed out of reach.
      return Redact(UnavailableError(what + ": out of time: " + result.message()));
    }
    return Redact(result);
  }

 private:
  Status Canceled(const WatchFrame& f) const {
    if (f.compact_revision > 0) {
      return Status(kEtcdCompacted, fmt::format("the start revision was compacted at revision {}; re-read, "
                                                "then watch from the read's revision + 1",
                                                f.compact_revision));
    }
    std::string reason = output::EscapeInvalidUtf8(f.cancel_reason.substr(0, 300));
    // "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
    if (reason.find("code = Unauthenticated") != std::string::npos ||
        reason.find("invalid auth token") != std::string::npos ||
        reason.find("user name is empty") != std::string::npos) {
      return PermissionDeniedError("etcd refused the watch: " + reason);
    }
    if (reason.find("code = PermissionDenied") != std::string::npos) {
      return PermissionDeniedError("etcd refused the watch: " + reason);
    }
    if (reason.find("code = InvalidArgument") != std::string::npos) {
      return InvalidArgumentError("etcd refused the watch: " + reason);
    }
    return UnavailableError("etcd cancelled the watch: " + (reason.empty() ? std::string("no reason given") : reason));
  }

  CallContext Bound(const CallContext& ctx) const {
    CallContext c = ctx;
    if (!c.clock) c.clock = &clock_;
    auto at = c.clock->Now() + o_.request_timeout;
    if (!c.deadline || at < *c.deadline) c.deadline = at;
    return c;
  }

  HttpRequest Request(const std::string& endpoint, const char* path, const std::string& body,
                      const std::string& token) const {
    HttpRequest req;
    req.method = "POST";
    req.url = endpoint + path;
    req.headers = {{"Content-Type", "application/json"}};
    if (!token.empty()) req.headers.emplace_back("Authorization", token);
    req.body = body;
    req.timeout = o_.request_timeout;
    req.connect_timeout = o_.connect_timeout;
    req.ca_file = o_.ca_file;
    req.cert_file = o_.cert_file;
    req.key_file = o_.key_file;
    return req;
  }

  std::size_t Preferred() {
    std::lock_guard lk(mu_);
    return preferred_;
  }
  void SetPreferred(std::size_t idx) {
    std::lock_guard lk(mu_);
    preferred_ = idx;
  }
  void ForgetToken(const std::string& token) {
    std::lock_guard lk(mu_);
    if (token_ == token) token_.clear();
    auth_off_ = false;  // etcd asked for a token after all: auth was enabled since
  }

  // The auth token ("" without auth), authenticating at `endpoint` if there
  // is none. kUnavailable: the endpoint could not be reached.
  StatusOr<std::string> Token(const std::string& endpoint, const CallContext& ctx) {
    if (o_.user.empty()) return std::string();
    {
      std::lock_guard lk(mu_);
      if (!token_.empty() || auth_off_) return token_;
    }
    std::string what = fmt::format("etcd authentication as user {} at {}", Quote(o_.user), endpoint);
    HttpRequest req = Request(endpoint, "/v3/auth/authenticate",
                              json{{"name", o_.user}, {"password", o_.password}}.dump(-1, ' ', false, json::error_handler_t::replace), "");
    auto r = http_.Send(req, ctx);
    if (!r.ok()) {
      Status s = Named(what, r.status());
      if (CertificateRefused(r.status())) return CertificateError(s);
      return s.code() == StatusCode::kDeadlineExceeded && !ctx.expired() ? UnavailableError(s.message()) : s;
    }
    if (r->status / 100 != 2) {
      auto e = ParseError(r->status, r->body);
      if (e.message.find("authentication is not enabled") != std::string::npos) {
        // As clientv3 does: credentials for a cluster without auth are not
        // an error; requests go without a token until etcd asks for one.
        std::lock_guard lk(mu_);
        auth_off_ = true;
        return std::string();
      }
      Status s = ErrorStatus(what, "", e);
      if (s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kPermissionDenied) {
        // etcd says InvalidArgument for a wrong password.
        return Redact(PermissionDeniedError(s.message() + "; check the etcd user and password"));
      }
      return Redact(s);
    }
    auto token = ParseAuthenticate(r->body);
    if (!token.ok()) return Named(what, token.status());
    std::lock_guard lk(mu_);
    token_ = *token;
    return token_;
  }

  Status ErrorStatus(const std::string& what, const std::string& endpoint, const EtcdError& e) const {
    std::string where = endpoint.empty() ? what : what + ": " + endpoint;
    if (e.grpc_code < 0) {
      // Not etcd's own error body: a proxy, or not an etcd gateway at all.
      StatusCode code = e.message.rfind("HTTP 5", 0) == 0 ? StatusCode::kUnavailable : StatusCode::kInvalidArgument;
      if (e.message.rfind("HTTP 401", 0) == 0 || e.message.rfind("HTTP 403", 0) == 0) code = StatusCode::kPermissionDenied;
      return Redact(Status(code, fmt::format("{}: {} (is this an etcd 3.4+ client URL?)", where, e.message)));
    }
    std::string msg = fmt::format("{}: {}", where, e.message);
    if (e.message.find("user name is empty") != std::string::npos) {
      if (o_.user.empty()) {
        return PermissionDeniedError(msg + "; etcd has auth enabled: set the etcd user and password");
      }
      return Redact(PermissionDeniedError(msg));
    }
    return Redact(Status(StatusFromGrpc(e.grpc_code), msg));
  }

  Status CertificateError(const Status& s) const {
    return PermissionDeniedError(fmt::format("{}; etcd refused the client certificate: check the etcd cert and key "
                                             "files ({}) and that etcd's CA signed them",
                                             s.message(), o_.cert_file.empty() ? "none configured" : o_.cert_file));
  }

  Status Named(const std::string& what, const Status& s) const {
    if (s.ok()) return s;
    return Redact(Status(s.code(), what + ": " + s.message()));
  }

  // Neither the password nor the token may reach an error (an echoing
  // server or proxy could put them in its message).
  Status Redact(Status s) const {
    std::string m = s.message();
    std::string token;
    {
      std::lock_guard lk(mu_);
      token = token_;
    }
    const std::string* secrets[] = {&o_.password, &token};
    for (const std::string* secret : secrets) {
      if (secret->size() < 4) continue;
      for (auto at = m.find(*secret); at != std::string::npos; at = m.find(*secret, at)) {
        m.replace(at, secret->size(), "***");
      }
    }
    return m == s.message() ? s : Status(s.code(), std::move(m));
  }

  // One call: endpoints in order from the preferred one, re-authenticating
  // once, retried briefly (idempotent calls only) within the bound.
  StatusOr<std::string> Call(const std::string& what, const char* path, const std::string& body, Idempotency idem,
                             const CallContext& caller) {
    if (o_.endpoints.empty()) return InvalidArgumentError(what + ": no etcd endpoints configured");
    CallContext ctx = Bound(caller);
    LimitedErrorCountRetryPolicy retry(3);
    ExponentialBackoffPolicy backoff(std::chrono::milliseconds(100), std::chrono::seconds(1), 2.0);
    ContextSleeper sleeper(ctx, &sleeper_);
    bool reauthed = false;
    auto result = RetryLoop(retry, backoff, idem, sleeper, [&]() -> StatusOr<std::string> {
      if (auto s = ctx.Check(what); !s.ok()) return s;
      return OneRound(what, path, body, idem, ctx, reauthed);
    });
    Status st = result.status();
    if (st.code() == StatusCode::kCancelled && !ctx.cancelled() && ctx.deadline) {
      return DeadlineExceededError("out of time: " + st.message());
    }
    return result;
  }

  StatusOr<std::string> OneRound(const std::string& what, const char* path, const std::string& body, Idempotency idem,
                                 const CallContext& ctx, bool& reauthed) {
    Status last;
    std::size_t start = Preferred();
    for (std::size_t i = 0; i < o_.endpoints.size(); ++i) {
      if (auto s = ctx.Check(what); !s.ok()) return last.ok() ? s : Status(s.code(), s.message() + "; " + last.message());
      std::size_t idx = (start + i) % o_.endpoints.size();
      const std::string& endpoint = o_.endpoints[idx];
      auto token = Token(endpoint, ctx);
      if (!token.ok()) {
        if (token.status().code() == StatusCode::kUnavailable) {
          last = token.status();
          continue;
        }
        return token.status();
      }
      HttpRequest req = Request(endpoint, path, body, *token);
      auto r = http_.Send(req, ctx);
      if (!r.ok()) {
        Status s = Named(what, r.status());  // libcurl's message names the URL
        if (ctx.cancelled() || ctx.expired() || r.status().code() == StatusCode::kInvalidArgument) return s;
        if (CertificateRefused(r.status())) return CertificateError(s);
        if (idem == Idempotency::kIdempotent || NeverSent(r.status())) {
          last = UnavailableError(s.message());
          continue;
        }
        return UnavailableError(s.message() +
                                "; the outcome is unknown: etcd may have applied it (not retried: re-read, or use a txn "
                                "compare to make the write safe to repeat)");
      }
      SetPreferred(idx);
      if (r->status / 100 == 2) {
        // A streamed call (lease keep-alive) reports errors in its body.
        json j = json::parse(r->body.substr(0, r->body.find('\n')), nullptr, false);
        if (!(j.is_object() && j.contains("error") && j["error"].is_object())) return std::move(r->body);
      }
      auto e = ParseError(r->status, r->body);
      if (IsAuthError(e) && !reauthed && !o_.user.empty()) {
        // Refused before it was applied: safe to send again, writes too.
        reauthed = true;
        ForgetToken(*token);
        --i;
        continue;
      }
      Status s = ErrorStatus(what, endpoint, e);
      // "no leader", "request timed out", a proxy's 503: another member may
      // do better, but only for calls that may be repeated.
      if (s.code() == StatusCode::kUnavailable && idem == Idempotency::kIdempotent) {
        last = s;
        continue;
      }
      return s;
    }
    return last;
  }

  EtcdOptions o_;
  Sleeper& sleeper_;
  const Clock& clock_;
  HttpPool http_;
  mutable std::mutex mu_;
  std::size_t preferred_ = 0;
  std::string token_;
  bool auth_off_ = false;  // etcd said auth is not enabled
};

}  // namespace

std::unique_ptr<EtcdClient> MakeEtcdClient(EtcdOptions options, Sleeper& sleeper, const Clock& clock,
                                           std::function<std::unique_ptr<HttpClient>()> make_http) {
  return std::make_unique<EtcdClientImpl>(std::move(options), sleeper, clock, std::move(make_http));
}

std::unique_ptr<EtcdClient> MakeEtcdClient(EtcdOptions options, Sleeper& sleeper, const Clock& clock) {
  return MakeEtcdClient(std::move(options), sleeper, clock, MakeCurlHttpClient);
}

}  // namespace spotvisor
