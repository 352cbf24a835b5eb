// A client for etcd v3 through its JSON gateway (grpc-gateway, etcd 3.4:
// POST /v3/kv/range, /v3/kv/put, /v3/kv/txn, /v3/lease/..., /v3/watch),
// over the project's libcurl client: gang membership, leases, the barrier
// and the stop signal (issue #16) need nothing more, and no gRPC stack.
//
// Every call is bounded by min(request_timeout, the context's deadline) and
// cut short at once when the context is cancelled (a parked Watch too).
// Endpoints are tried in order; a transport failure moves on to the next,
// and the one that answered is tried first next time.
//
// Idempotency: Range, the lease calls and Watch are retried briefly on
// transport errors within the deadline, on every endpoint. Put, Delete and
// Txn are NOT retried after a request may have reached etcd (a timeout, a
// connection reset): a lost answer may hide a change that a retry would make
// twice. They fail over only when the request certainly never left (the
// connection was refused, the name did not resolve, TLS failed), or when
// etcd refused the request's auth token. Make writes safe to repeat with Txn
// compares (create_revision == 0, mod_revision == what was read) and re-read
// after an kUnavailable "outcome unknown".
//
// Errors name the endpoint and carry etcd's own message; gRPC codes become
// Status codes (see etcd_internal::StatusFromGrpc). The password and the auth
// token never appear in an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "http/http_client.h"
#include "retry/sleeper.h"

namespace spotvisor {

struct EtcdOptions {
  // "http://10.0.0.5:2379", "https://etcd.internal:2379"; tried in order.
  std::vector<std::string> endpoints;
  // TLS for https endpoints (PEM files): the CA that signed etcd's
  // certificate, and the client certificate etcd's --client-cert-auth asks for.
  std::string ca_file, cert_file, key_file;
  // Auth: /v3/auth/authenticate gives a token sent as "Authorization: TOKEN";
  // an invalid or expired token is replaced once per call.
  std::string user, password;
  std::chrono::milliseconds request_timeout{5000};
  // Per connection attempt, so a dead endpoint leaves time for the next.
  std::chrono::milliseconds connect_timeout{2000};
};

struct EtcdKv {
  std::string key, value;
  std::int64_t create_revision = 0, mod_revision = 0, version = 0, lease = 0;
  friend bool operator==(const EtcdKv&, const EtcdKv&) = default;
};

struct EtcdCompare {
  enum Target { kVersion, kCreate, kMod, kValue, kLease } target;
  enum Result { kEqual, kGreater, kLess, kNotEqual } result;
  std::string key;
  std::int64_t number = 0;  // the version, revision or lease compared with
  std::string value;        // for kValue
};

struct EtcdOp {
  enum Kind { kPut, kDelete, kRange } kind;
  std::string key, value, range_end;
  std::int64_t lease = 0;
};

struct EtcdTxnResult {
  bool succeeded = false;
  std::int64_t revision = 0;
  // One per kRange op of the branch that ran (success or failure), in order.
  std::vector<std::vector<EtcdKv>> ranges;
};

struct EtcdEvent {
  enum Type { kPut, kDelete } type;
  EtcdKv kv;  // for kDelete: the key and the deletion's mod_revision
  friend bool operator==(const EtcdEvent&, const EtcdEvent&) = default;
};

// Watch's status when the requested start revision has been compacted away.
// StatusCode has no kOutOfRange (gRPC's code for it) yet, so compaction is
// kFailedPrecondition, which Watch returns for nothing else; the message
// carries the compact revision (EtcdCompactRevision reads it back).
inline constexpr StatusCode kEtcdCompacted = StatusCode::kFailedPrecondition;
// The compact revision of a Watch compaction status; nullopt for any other.
std::optional<std::int64_t> EtcdCompactRevision(const Status& s);

class EtcdClient {
 public:
  virtual ~EtcdClient() = default;
  // A new lease (its id) that expires `ttl` after the last keep-alive.
  virtual StatusOr<std::int64_t> LeaseGrant(std::chrono::seconds ttl, const CallContext& ctx) = 0;
  // Renews the lease; returns the TTL it now has. kNotFound when the lease
  // has expired or was revoked: its keys are gone.
  virtual StatusOr<std::chrono::seconds> LeaseKeepAlive(std::int64_t lease, const CallContext& ctx) = 0;
  // The TTL the lease has left, without renewing it; kNotFound when gone.
  virtual StatusOr<std::chrono::seconds> LeaseTimeToLive(std::int64_t lease, const CallContext& ctx) = 0;
  // Ends the lease and deletes its keys. kNotFound: no such lease (expired,
  // revoked, or revoked by an earlier attempt whose answer was lost).
  virtual Status LeaseRevoke(std::int64_t lease, const CallContext& ctx) = 0;
  // Returns the revision of the put. lease 0: none. Not retried (see above).
  virtual StatusOr<std::int64_t> Put(const std::string& key, const std::string& value, std::int64_t lease,
                                     const CallContext& ctx) = 0;
  // range_end empty: the one key; PrefixEnd(prefix): every key under
  // prefix. Returns the kvs (in key order) and the store's revision.
  virtual StatusOr<std::pair<std::vector<EtcdKv>, std::int64_t>> Range(const std::string& key,
                                                                       const std::string& range_end,
                                                                       const CallContext& ctx) = 0;
  // Returns how many keys were deleted. Not retried (see above).
  virtual StatusOr<std::int64_t> Delete(const std::string& key, const std::string& range_end,
                                        const CallContext& ctx) = 0;
  // If every compare holds, the success ops run, else the failure ops; all
  // atomically. Not retried (see above).
  virtual StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compare, const std::vector<EtcdOp>& success,
                                      const std::vector<EtcdOp>& failure, const CallContext& ctx) = 0;
  // Streams the events on [key, range_end) from start_revision (0: from
  // now) to on_events, on the calling thread, in revision order; `revision`
  // is the store's revision as of the batch. An empty batch says the watch
  // is in place as of `revision` (sent once, when etcd confirms it).
  // on_events runs inside the HTTP transfer: it must not throw, and the
  // stream waits while it runs.
  // Returns when:
  // - ctx is cancelled or its deadline passes: OkStatus (the watch ended
  //   because the caller asked; re-watch from the last revision seen + 1);
  // - the stream fails or ends (etcd died, the connection broke): kUnavailable
  //   naming the endpoint; re-watch from the last revision seen + 1;
  // - start_revision was compacted: kEtcdCompacted, the compact revision in
  //   the message (EtcdCompactRevision); re-read with Range, then re-watch
  //   from that read's revision + 1;
  // - auth or the request was refused: kPermissionDenied / kInvalidArgument.
  // The stream has no heartbeat (the gateway speaks HTTP/1.1): an endpoint
  // that vanishes without closing the connection is only noticed at the
  // deadline, so watch with one (a minute, say) and re-watch; the lease
  // keep-alive is the liveness signal.
  virtual Status Watch(const std::string& key, const std::string& range_end, std::int64_t start_revision,
                       const std::function<void(const std::vector<EtcdEvent>&, std::int64_t revision)>& on_events,
                       const CallContext& ctx) = 0;
};

// etcd's range end for "every key that starts with prefix" (clientv3's
// GetPrefixRangeEnd): the prefix with its last byte below 0xff incremented
// and what follows dropped; "\0" (every key) for "" or all-0xff prefixes.
std::string PrefixEnd(std::string_view prefix);

std::unique_ptr<EtcdClient> MakeEtcdClient(EtcdOptions options, Sleeper& sleeper, const Clock& clock);
// The same over another HTTP client (unit tests: canned answers).
std::unique_ptr<EtcdClient> MakeEtcdClient(EtcdOptions options, Sleeper& sleeper, const Clock& clock,
                                           std::function<std::unique_ptr<HttpClient>()> make_http);

// The gateway's JSON, built and parsed without I/O; exposed for tests.
namespace etcd_internal {

// A signed 64-bit integer as proto3 JSON writes it: a decimal string, or a
// plain JSON integer. Anything else (floats, overflow, "12x") is nullopt.
std::optional<std::int64_t> ParseInt64(std::string_view s);

std::string RangeBody(const std::string& key, const std::string& range_end);
std::string PutBody(const std::string& key, const std::string& value, std::int64_t lease);
std::string DeleteBody(const std::string& key, const std::string& range_end);
std::string TxnBody(const std::vector<EtcdCompare>& compare, const std::vector<EtcdOp>& success,
                    const std::vector<EtcdOp>& failure);
std::string WatchBody(const std::string& key, const std::string& range_end, std::int64_t start_revision);

// A 2xx answer of each call. Errors are kInternal: etcd (or whatever
// answered) sent something that is not what the call returns.
StatusOr<std::pair<std::vector<EtcdKv>, std::int64_t>> ParseRange(std::string_view body);
StatusOr<std::int64_t> ParsePut(std::string_view body);     // the revision
StatusOr<std::int64_t> ParseDelete(std::string_view body);  // deleted count
StatusOr<EtcdTxnResult> ParseTxn(std::string_view body);
StatusOr<std::pair<std::int64_t, std::int64_t>> ParseLeaseGrant(std::string_view body);  // id, ttl
// TTL (seconds) of lease/keepalive (a stream frame {"result":{...}}) and
// lease/timetolive; -1 when the lease is gone.
StatusOr<std::int64_t> ParseLeaseKeepAlive(std::string_view body);
StatusOr<std::int64_t> ParseLeaseTimeToLive(std::string_view body);
StatusOr<std::string> ParseAuthenticate(std::string_view body);  // the token

// What an error answer says: etcd's {"error","message","code"} body (or a
// streamed {"error":{"grpc_code","message"}} frame), else the HTTP status.
struct EtcdError {
  int grpc_code = -1;  // -1: not an etcd error body
  std::string message;
};
EtcdError ParseError(long http_status, std::string_view body);
// gRPC status code -> StatusCode (Unauthenticated -> kPermissionDenied).
StatusCode StatusFromGrpc(int grpc_code);

// One frame of the watch stream.
struct WatchFrame {
  bool created = false, canceled = false;
  std::int64_t revision = 0;  // header.revision
  std::int64_t compact_revision = 0;
  std::string cancel_reason;
  std::vector<EtcdEvent> events;
  EtcdError error;  // grpc_code >= 0: an error frame
};
StatusOr<WatchFrame> ParseWatchFrame(std::string_view line);

// Splits the watch stream into newline-delimited frames: the gateway writes
// one JSON object per message followed by "\n", and an HTTP chunk may end
// anywhere. A frame longer than `max_frame` is an error (a hostile server
// must not make us buffer without end).
class FrameSplitter {
 public:
  explicit FrameSplitter(std::size_t max_frame) : max_frame_(max_frame) {}
  // Appends `data`; calls `on_frame` for each complete non-empty line.
  // Returns false (and stops) when a frame is too long or on_frame says so.
  bool Feed(std::string_view data, const std::function<bool(std::string_view)>& on_frame);
  std::size_t buffered() const { return buf_.size(); }

 private:
  std::size_t max_frame_;
  std::string buf_;
};

}  // namespace etcd_internal
}  // namespace spotvisor
