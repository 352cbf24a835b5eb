#include "gang/etcd_client.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "storage/crc32c.h"

namespace spotvisor {
namespace {

using namespace etcd_internal;  // NOLINT
using json = nlohmann::json;

std::string B64(std::string_view s) { return Base64Encode(s); }

// What etcd 3.4.23's gateway answered to the same requests (captured by hand).
constexpr char kRangeAnswer[] =
    R"({"header":{"cluster_id":"15118495548433857066","member_id":"13668033151171901709","revision":"2","raft_term":"2"},)"
    R"("kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"})";

TEST_CASE("PrefixEnd is clientv3's GetPrefixRangeEnd", "[etcd]") {
  CHECK(PrefixEnd("a") == "b");
  CHECK(PrefixEnd("gang/x/") == "gang/x0");
  CHECK(PrefixEnd(std::string("a\xff", 2)) == "b");
  CHECK(PrefixEnd(std::string("a\xfe", 2)) == std::string("a\xff", 2));
  CHECK(PrefixEnd(std::string("\xff\xff", 2)) == std::string(1, '\0'));
  CHECK(PrefixEnd("") == std::string(1, '\0'));
}

TEST_CASE("ParseInt64 takes proto3's int64 strings and nothing else", "[etcd]") {
  CHECK(ParseInt64("0") == 0);
  CHECK(ParseInt64("-1") == -1);
  CHECK(ParseInt64("9223372036854775807") == INT64_MAX);
  CHECK(ParseInt64("-9223372036854775808") == INT64_MIN);
  for (const char* bad : {"9223372036854775808", "-9223372036854775809", "99999999999999999999", "", "-", "12x",
                          "+1", " 1", "1.5", "1e3", "0x10"}) {
    INFO(bad);
    CHECK_FALSE(ParseInt64(bad).has_value());
  }
}

TEST_CASE("request bodies: base64 keys and values, int64s as strings, zero fields left out", "[etcd]") {
  json put = json::parse(PutBody(std::string("k\0\xff", 3), "v", 0));
  CHECK(put == json{{"key", B64(std::string("k\0\xff", 3))}, {"value", B64("v")}});
  CHECK(json::parse(PutBody("k", "", 7587862345))["lease"] == "7587862345");
  CHECK(json::parse(RangeBody("a", "")) == json{{"key", B64("a")}});
  CHECK(json::parse(RangeBody("a", "b")) == json{{"key", B64("a")}, {"range_end", B64("b")}});
  CHECK(json::parse(WatchBody("a", "b", 0)) == json{{"create_request", {{"key", B64("a")}, {"range_end", B64("b")}}}});
  CHECK(json::parse(WatchBody("a", "", 42))["create_request"]["start_revision"] == "42");

  json txn = json::parse(TxnBody(
      {{EtcdCompare::kCreate, EtcdCompare::kEqual, "k", 0, ""}, {EtcdCompare::kValue, EtcdCompare::kNotEqual, "v", 0, "x"},
       {EtcdCompare::kMod, EtcdCompare::kLess, "m", 5, ""}, {EtcdCompare::kVersion, EtcdCompare::kGreater, "n", 2, ""},
       {EtcdCompare::kLease, EtcdCompare::kEqual, "l", 9, ""}},
      {{EtcdOp::kPut, "k", "v", "", 3}}, {{EtcdOp::kRange, "k", "", "", 0}, {EtcdOp::kDelete, "a", "", "b", 0}}));
  CHECK(txn["compare"][0] ==
        json{{"key", B64("k")}, {"result", "EQUAL"}, {"target", "CREATE"}, {"create_revision", "0"}});
  CHECK(txn["compare"][1] == json{{"key", B64("v")}, {"result", "NOT_EQUAL"}, {"target", "VALUE"}, {"value", B64("x")}});
  CHECK(txn["compare"][2]["mod_revision"] == "5");
  CHECK(txn["compare"][2]["result"] == "LESS");
  CHECK(txn["compare"][3]["version"] == "2");
  CHECK(txn["compare"][4]["lease"] == "9");
  CHECK(txn["success"][0] == json{{"request_put", {{"key", B64("k")}, {"value", B64("v")}, {"lease", "3"}}}});
  CHECK(txn["failure"][0] == json{{"request_range", {{"key", B64("k")}}}});
  CHECK(txn["failure"][1] == json{{"request_delete_range", {{"key", B64("a")}, {"range_end", B64("b")}}}});
}

TEST_CASE("ParseRange reads etcd's answer and takes missing fields as proto3 zeros", "[etcd]") {
  auto r = ParseRange(kRangeAnswer);
  REQUIRE(r.ok());
  CHECK(r->second == 2);
  REQUIRE(r->first.size() == 1);
  CHECK(r->first[0] == EtcdKv{"foo", "bar", 2, 2, 1, 0});
  // No kvs at all: etcd leaves the empty list (and count 0) out.
  auto none = ParseRange(R"({"header":{"revision":"9"}})");
  REQUIRE(none.ok());
  CHECK(none->first.empty());
  CHECK(none->second == 9);
  // Plain JSON numbers are taken too.
  auto nums = ParseRange(R"({"header":{"revision":9},"kvs":[{"key":"YQ==","lease":12}]})");
  REQUIRE(nums.ok());
  CHECK(nums->first[0].lease == 12);
}

TEST_CASE("ParseRange refuses hostile answers without throwing", "[etcd]") {
  for (const char* bad : {
           "", "not json", "[]", "null", "\"x\"", R"({"header":"x"})", R"({"header":{"revision":true}})",
           R"({"header":{"revision":"99999999999999999999"}})", R"({"header":{"revision":1e30}})",
           R"({"header":{"revision":18446744073709551615}})", R"({"header":{"revision":"1.5"}})",
           R"({"kvs":"x"})", R"({"kvs":[1]})", R"({"kvs":[{"key":"!!"}]})", R"({"kvs":[{"key":"YQ"}]})",
           R"({"kvs":[{"key":123}]})", R"({"kvs":[{"value":["a"]}]})", R"({"kvs":[{"mod_revision":{}}]})",
           R"({"kvs":[{"key":"YQ==")", "{\"kvs\":[{\"key\":\"\xff\"}]}"}) {
    INFO(bad);
    auto r = ParseRange(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInternal);
  }
}

TEST_CASE("ParseTxn returns the branch's ranges in order", "[etcd]") {
  auto t = ParseTxn(
      R"({"header":{"revision":"5"},"responses":[{"response_range":{"header":{"revision":"4"},"kvs":[{"key":"Zm9v","create_revision":"4","mod_revision":"4","version":"1","value":"YmFy"}],"count":"1"}},)"
      R"({"response_put":{"header":{"revision":"5"}}},{"response_range":{"header":{"revision":"5"}}}]})");
  REQUIRE(t.ok());
  CHECK_FALSE(t->succeeded);  // etcd leaves "succeeded": false out
  CHECK(t->revision == 5);
  REQUIRE(t->ranges.size() == 2);
  CHECK(t->ranges[0].size() == 1);
  CHECK(t->ranges[0][0].key == "foo");
  CHECK(t->ranges[1].empty());
  auto ok = ParseTxn(R"({"header":{"revision":"4"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"4"}}}]})");
  REQUIRE(ok.ok());
  CHECK(ok->succeeded);
  for (const char* bad : {R"({"succeeded":"yes"})", R"({"responses":{}})", R"({"responses":[3]})",
                          R"({"responses":[{"response_range":[]}]})",
                          R"({"responses":[{"response_range":{"kvs":[{"key":"*"}]}}]})"}) {
    INFO(bad);
    CHECK_FALSE(ParseTxn(bad).ok());
  }
}

TEST_CASE("lease answers: grant, keep-alive frames, time-to-live", "[etcd]") {
  auto g = ParseLeaseGrant(R"({"header":{"revision":"2"},"ID":"4111120231182669577","TTL":"5"})");
  REQUIRE(g.ok());
  CHECK(g->first == 4111120231182669577);
  CHECK(g->second == 5);
  CHECK_FALSE(ParseLeaseGrant(R"({"ID":"1","TTL":"5","error":"lease already exists"})").ok());
  CHECK_FALSE(ParseLeaseGrant(R"({"TTL":"5"})").ok());
  CHECK_FALSE(ParseLeaseGrant(R"({"ID":"1","TTL":"-5"})").ok());

  CHECK(ParseLeaseKeepAlive("{\"result\":{\"header\":{},\"ID\":\"1\",\"TTL\":\"5\"}}\n").value() == 5);
  // etcd's answer for a lease that is gone: the ID and no TTL.
  CHECK(ParseLeaseKeepAlive(R"({"result":{"header":{"revision":"2"},"ID":"12345"}})").value() == -1);
  CHECK_FALSE(ParseLeaseKeepAlive(R"({"ID":"1","TTL":"5"})").ok());
  CHECK_FALSE(ParseLeaseKeepAlive(R"({"result":{"TTL":"5x"}})").ok());
  CHECK(ParseLeaseTimeToLive(R"({"ID":"12345","TTL":"-1"})").value() == -1);
  CHECK(ParseLeaseTimeToLive(R"({"ID":"12345","TTL":"3","grantedTTL":"5"})").value() == 3);

  CHECK(ParseAuthenticate(R"({"header":{},"token":"wJnbSBJZentYADEl.22"})").value() == "wJnbSBJZentYADEl.22");
  CHECK_FALSE(ParseAuthenticate(R"({"header":{}})").ok());
  CHECK_FALSE(ParseAuthenticate(R"({"token":"a\r\nX-Evil: 1"})").ok());
  CHECK_FALSE(ParseAuthenticate(R"({"token":7})").ok());
}

TEST_CASE("error bodies: etcd's, a streamed error frame, and anything else", "[etcd]") {
  auto e = ParseError(404, R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})");
  CHECK(e.grpc_code == 5);
  CHECK(e.message == "etcdserver: requested lease not found");
  auto frame = ParseError(200, R"({"error":{"grpc_code":14,"http_code":503,"message":"no leader","http_status":"Service Unavailable"}})");
  CHECK(frame.grpc_code == 14);
  CHECK(frame.message == "no leader");
  auto proxy = ParseError(502, "<html>Bad Gateway</html>");
  CHECK(proxy.grpc_code == -1);
  CHECK(proxy.message == "HTTP 502: <html>Bad Gateway</html>");
  CHECK(ParseError(400, R"({"code":"x","message":"m"})").grpc_code == -1);
  CHECK(ParseError(400, R"({"code":99,"message":"m"})").grpc_code == -1);
  // Invalid UTF-8 is not JSON: the body is shown, escaped.
  auto bad_utf8 = ParseError(400, "{\"code\":3,\"message\":\"bad \xff\"}");
  CHECK(bad_utf8.grpc_code == -1);
  CHECK(bad_utf8.message == "HTTP 400: {\"code\":3,\"message\":\"bad \\xff\"}");
  CHECK(StatusFromGrpc(5) == StatusCode::kNotFound);
  CHECK(StatusFromGrpc(16) == StatusCode::kPermissionDenied);
  CHECK(StatusFromGrpc(14) == StatusCode::kUnavailable);
  CHECK(StatusFromGrpc(11) == kEtcdCompacted);
}

TEST_CASE("watch frames: created, events, compaction, errors", "[etcd]") {
  auto created = ParseWatchFrame(R"({"result":{"header":{"revision":"5"},"created":true}})");
  REQUIRE(created.ok());
  CHECK(created->created);
  CHECK(created->revision == 5);
  auto events = ParseWatchFrame(
      R"({"result":{"header":{"revision":"7"},"events":[{"kv":{"key":"YQ==","create_revision":"6","mod_revision":"6","version":"1","value":"MQ=="}},)"
      R"({"type":"DELETE","kv":{"key":"YQ==","mod_revision":"7"}}]}})");
  REQUIRE(events.ok());
  REQUIRE(events->events.size() == 2);
  CHECK(events->events[0] == EtcdEvent{EtcdEvent::kPut, {"a", "1", 6, 6, 1, 0}});
  CHECK(events->events[1] == EtcdEvent{EtcdEvent::kDelete, {"a", "", 0, 7, 0, 0}});
  auto compacted = ParseWatchFrame(R"({"result":{"header":{"revision":"5"},"canceled":true,"compact_revision":"4"}})");
  REQUIRE(compacted.ok());
  CHECK(compacted->canceled);
  CHECK(compacted->compact_revision == 4);
  auto unauth = ParseWatchFrame(
      R"({"result":{"header":{},"watch_id":"-1","created":true,"canceled":true,"cancel_reason":"rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"}})");
  REQUIRE(unauth.ok());
  CHECK(unauth->cancel_reason.find("Unauthenticated") != std::string::npos);
  auto err = ParseWatchFrame(R"({"error":{"grpc_code":14,"message":"transport is closing"}})");
  REQUIRE(err.ok());
  CHECK(err->error.grpc_code == 14);
  for (const char* bad : {R"({"result":[]})", R"({"nothing":1})", R"({"result":{"events":{}}})",
                          R"({"result":{"events":[{"type":"EXPLODE","kv":{}}]}})",
                          R"({"result":{"events":[{"kv":{"key":"%%%%"}}]}})", R"({"result":{"events":[{"kv":"x"}]}})",
                          R"({"result":{"created":"true"}})", R"({"result":{"compact_revision":"4x"}})",
                          R"({"result":{"header":{"revision":"5"},"events":[)"}) {
    INFO(bad);
    CHECK_FALSE(ParseWatchFrame(bad).ok());
  }
}

TEST_CASE("FrameSplitter: frames split anywhere by HTTP chunks come out whole", "[etcd]") {
  std::string stream = "{\"a\":1}\n{\"b\":2}\n\n{\"c\":3}\n";
  for (std::size_t cut = 0; cut <= stream.size(); ++cut) {
    FrameSplitter s(1000);
    std::vector<std::string> frames;
    auto take = [&](std::string_view f) {
      frames.emplace_back(f);
      return true;
    };
    REQUIRE(s.Feed(std::string_view(stream).substr(0, cut), take));
    REQUIRE(s.Feed(std::string_view(stream).substr(cut), take));
    CHECK(frames == std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "{\"c\":3}"});
    CHECK(s.buffered() == 0);
  }
  // A truncated frame stays buffered, never delivered half.
  FrameSplitter s(1000);
  int n = 0;
  REQUIRE(s.Feed("{\"a\":1}\n{\"b\"", [&](std::string_view) { return ++n, true; }));
  CHECK(n == 1);
  CHECK(s.buffered() == 4);
  // Too long, and a consumer that says stop.
  FrameSplitter small(8);
  CHECK_FALSE(small.Feed("0123456789", [](std::string_view) { return true; }));
  FrameSplitter stop(100);
  int seen = 0;
  CHECK_FALSE(stop.Feed("{}\n{}\n{}\n", [&](std::string_view) { return ++seen, false; }));
  CHECK(seen == 1);
}

TEST_CASE("EtcdCompactRevision reads only compaction statuses", "[etcd]") {
  CHECK(EtcdCompactRevision(Status(kEtcdCompacted, "etcd watch \"a\": x: the start revision was compacted at revision 42; re-read")) == 42);
  CHECK_FALSE(EtcdCompactRevision(UnavailableError("compacted at revision 42")).has_value());
  CHECK_FALSE(EtcdCompactRevision(Status(kEtcdCompacted, "other")).has_value());
}

// --- The client over a scripted HTTP client: no network, no sleeps. ---

struct Script {
  std::vector<HttpRequest> requests;
  std::function<StatusOr<HttpResponse>(const HttpRequest&)> answer;
};

class ScriptedHttp final : public HttpClient {
 public:
  explicit ScriptedHttp(Script& s) : s_(s) {}
  StatusOr<HttpResponse> Perform(const HttpRequest& request) override {
    s_.requests.push_back(request);
    auto r = s_.answer(request);
    if (r.ok() && request.on_body && r->status / 100 == 2) {
      // Streamed in 7-byte pieces, as badly cut as a network could.
      std::string body = std::move(r->body);
      r->body.clear();
      for (std::size_t at = 0; at < body.size(); at += 7) {
        if (!request.on_body(std::string_view(body).substr(at, 7))) {
          return UnavailableError(request.url + " Failed writing received data to disk/application");
        }
      }
    }
    return r;
  }
  void Cancel() override {}

 private:
  Script& s_;
};

class NoSleep final : public Sleeper {
 public:
  bool SleepFor(std::chrono::milliseconds d) override {
    delays.push_back(d);
    return true;
  }
  std::vector<std::chrono::milliseconds> delays;
};

class FixedClock final : public Clock {
 public:
  SteadyTime Now() const override { return SteadyTime(std::chrono::hours(1)); }
  WallTime WallNow() const override { return WallTime(); }
};

HttpResponse Answer(long status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

struct Harness {
  Script script;
  NoSleep sleeper;
  FixedClock clock;
  std::unique_ptr<EtcdClient> client;
  explicit Harness(EtcdOptions o) {
    client = MakeEtcdClient(std::move(o), sleeper, clock, [this] { return std::make_unique<ScriptedHttp>(script); });
  }
  std::vector<std::string> Urls() const {
    std::vector<std::string> u;
    for (auto const& r : script.requests) u.push_back(r.url);
    return u;
  }
};

EtcdOptions TwoEndpoints() {
  EtcdOptions o;
  o.endpoints = {"http://a:2379/", "b:2379"};
  return o;
}

const char kRefused[] = "Couldn't connect to server: Failed to connect to a port 2379: Connection refused";

TEST_CASE("client: a refused endpoint fails over, and the one that answered is tried first next time", "[etcd]") {
  Harness h(TwoEndpoints());
  h.script.answer = [](const HttpRequest& r) -> StatusOr<HttpResponse> {
    if (r.url.rfind("http://a:2379", 0) == 0) return UnavailableError(r.url + " " + kRefused);
    return Answer(200, R"({"header":{"revision":"3"}})");
  };
  // Even a put moves on: a refused connection carried nothing.
  auto rev = h.client->Put("k", "v", 0, Background());
  REQUIRE(rev.ok());
  CHECK(*rev == 3);
  CHECK(h.Urls() == std::vector<std::string>{"http://a:2379/v3/kv/put", "http://b:2379/v3/kv/put"});
  CHECK(h.script.requests[1].method == "POST");
  CHECK(h.script.requests[1].timeout == std::chrono::milliseconds(5000));
  auto r = h.client->Range("k", "", Background());
  REQUIRE(r.ok());
  CHECK(h.Urls().back() == "http://b:2379/v3/kv/range");
  CHECK(h.script.requests.size() == 3);
}

TEST_CASE("client: a put whose answer was lost is not sent again", "[etcd]") {
  Harness h(TwoEndpoints());
  h.script.answer = [](const HttpRequest& r) -> StatusOr<HttpResponse> {
    return UnavailableError(r.url + " Failure when receiving data from the peer: Connection reset by peer");
  };
  auto rev = h.client->Put("k", "v", 0, Background());
  REQUIRE_FALSE(rev.ok());
  CHECK(rev.status().code() == StatusCode::kUnavailable);
  CHECK(rev.status().message().find("outcome is unknown") != std::string::npos);
  CHECK(rev.status().message().find("http://a:2379") != std::string::npos);
  CHECK(h.script.requests.size() == 1);
  CHECK(h.sleeper.delays.empty());
  // A txn and a delete neither.
  CHECK_FALSE(h.client->Txn({}, {}, {}, Background()).ok());
  CHECK_FALSE(h.client->Delete("k", "", Background()).ok());
  CHECK(h.script.requests.size() == 3);
}

TEST_CASE("client: reads are retried on every endpoint, briefly, with backoff", "[etcd]") {
  Harness h(TwoEndpoints());
  int calls = 0;
  h.script.answer = [&](const HttpRequest& r) -> StatusOr<HttpResponse> {
    if (++calls < 5) return UnavailableError(r.url + " Failure when receiving data from the peer");
    return Answer(200, kRangeAnswer);
  };
  auto r = h.client->Range("foo", "", Background());
  REQUIRE(r.ok());
  CHECK(r->first.at(0).value == "bar");
  CHECK(h.Urls() == std::vector<std::string>{"http://a:2379/v3/kv/range", "http://b:2379/v3/kv/range",
                                             "http://a:2379/v3/kv/range", "http://b:2379/v3/kv/range",
                                             "http://a:2379/v3/kv/range"});
  CHECK(h.sleeper.delays.size() == 2);
}

TEST_CASE("client: etcd's errors keep their meaning and name the endpoint", "[etcd]") {
  Harness h(TwoEndpoints());
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return Answer(404, R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})");
  };
  auto s = h.client->Put("k", "v", 77, Background());
  CHECK(s.status().code() == StatusCode::kNotFound);
  CHECK(s.status().message() == "etcd put \"k\": http://a:2379: etcdserver: requested lease not found");
  auto revoke = h.client->LeaseRevoke(77, Background());
  CHECK(revoke.code() == StatusCode::kNotFound);
  // A keep-alive on a lease that is gone: etcd answers 200 with no TTL.
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return Answer(200, "{\"result\":{\"header\":{\"revision\":\"2\"},\"ID\":\"77\"}}\n");
  };
  CHECK(h.client->LeaseKeepAlive(77, Background()).status().code() == StatusCode::kNotFound);
  // A stream's own error frame.
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return Answer(200, R"({"error":{"grpc_code":7,"message":"permission denied"}})");
  };
  CHECK(h.client->LeaseKeepAlive(77, Background()).status().code() == StatusCode::kPermissionDenied);
  // Not an etcd at all.
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> { return Answer(404, "404 page not found"); };
  auto notetcd = h.client->Range("k", "", Background());
  CHECK(notetcd.status().code() == StatusCode::kInvalidArgument);
  CHECK(notetcd.status().message().find("etcd 3.4+") != std::string::npos);
  // A garbage 200 is an error, not a crash.
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> { return Answer(200, "{\"kvs\":[{\"key\":5}]}"); };
  CHECK(h.client->Range("k", "", Background()).status().code() == StatusCode::kInternal);
}

TEST_CASE("client: auth sends the token, replaces a refused one once, and never leaks secrets", "[etcd]") {
  EtcdOptions o = TwoEndpoints();
  o.user = "root";
  o.password = "hunter2-secret";
  Harness h(o);
  int tokens = 0;
  h.script.answer = [&](const HttpRequest& r) -> StatusOr<HttpResponse> {
    if (r.url.find("/v3/auth/authenticate") != std::string::npos) {
      CHECK(json::parse(r.body) == json{{"name", "root"}, {"password", "hunter2-secret"}});
      return Answer(200, fmt::format(R"({{"header":{{}},"token":"tok-{}"}})", ++tokens));
    }
    std::string auth;
    for (auto const& [k, v] : r.headers) {
      if (k == "Authorization") auth = v;
    }
    if (auth != "tok-2") {
      return Answer(401, R"({"error":"etcdserver: invalid auth token","message":"etcdserver: invalid auth token","code":16})");
    }
    return Answer(200, R"({"header":{"revision":"8"}})");
  };
  auto rev = h.client->Put("k", "v", 0, Background());
  REQUIRE(rev.ok());
  CHECK(tokens == 2);
  CHECK(h.script.requests.size() == 4);  // auth, put (refused), auth, put
  // The token is kept.
  REQUIRE(h.client->Range("k", "", Background()).ok());
  CHECK(h.script.requests.size() == 5);

  // Only once per call: a token refused again is the answer.
  h.script.requests.clear();
  tokens = 10;
  h.client = MakeEtcdClient(o, h.sleeper, h.clock, [&h] { return std::make_unique<ScriptedHttp>(h.script); });
  auto refused = h.client->Put("k", "v", 0, Background());
  CHECK(refused.status().code() == StatusCode::kPermissionDenied);
  CHECK(h.script.requests.size() == 4);

  // A wrong password: named as such, the password nowhere, even echoed.
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return Answer(400, R"j({"error":"x","message":"etcdserver: authentication failed, invalid user ID or password (hunter2-secret)","code":3})j");
  };
  h.client = MakeEtcdClient(o, h.sleeper, h.clock, [&h] { return std::make_unique<ScriptedHttp>(h.script); });
  auto wrong = h.client->Range("k", "", Background());
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.status().code() == StatusCode::kPermissionDenied);
  CHECK(wrong.status().message().find("hunter2") == std::string::npos);
  CHECK(wrong.status().message().find("authentication failed") != std::string::npos);
  CHECK(wrong.status().message().find("\"root\"") != std::string::npos);
}

TEST_CASE("client: credentials for an etcd without auth send no token, and ask once", "[etcd]") {
  EtcdOptions o = TwoEndpoints();
  o.user = "root";
  o.password = "pw-secret";
  Harness h(o);
  h.script.answer = [](const HttpRequest& r) -> StatusOr<HttpResponse> {
    if (r.url.find("/v3/auth/authenticate") != std::string::npos) {
      return Answer(400, R"({"error":"etcdserver: authentication is not enabled","message":"etcdserver: authentication is not enabled","code":9})");
    }
    return Answer(200, kRangeAnswer);
  };
  REQUIRE(h.client->Range("foo", "", Background()).ok());
  REQUIRE(h.client->Range("foo", "", Background()).ok());
  CHECK(h.Urls() == std::vector<std::string>{"http://a:2379/v3/auth/authenticate", "http://a:2379/v3/kv/range",
                                             "http://a:2379/v3/kv/range"});
  for (auto const& r : h.script.requests) {
    for (auto const& [k, v] : r.headers) CHECK(k != "Authorization");
  }
}

TEST_CASE("client: auth is on but no user is configured", "[etcd]") {
  Harness h(TwoEndpoints());
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return Answer(400, R"({"error":"etcdserver: user name is empty","message":"etcdserver: user name is empty","code":3})");
  };
  auto r = h.client->Range("k", "", Background());
  CHECK(r.status().code() == StatusCode::kPermissionDenied);
  CHECK(r.status().message().find("set the etcd user and password") != std::string::npos);
}

TEST_CASE("client: no endpoints is a configuration error", "[etcd]") {
  Harness h(EtcdOptions{});
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> { return Answer(200, "{}"); };
  CHECK(h.client->Range("k", "", Background()).status().code() == StatusCode::kInvalidArgument);
  CHECK(h.client->Watch("k", "", 0, [](const std::vector<EtcdEvent>&, std::int64_t) {}, Background()).code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("client: a cancelled context sends nothing", "[etcd]") {
  Harness h(TwoEndpoints());
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> { return Answer(200, kRangeAnswer); };
  CallContext ctx;
  ctx.cancel = std::make_shared<CancelSource>();
  ctx.cancel->Cancel();
  CHECK(h.client->Range("k", "", ctx).status().code() == StatusCode::kCancelled);
  CHECK(h.script.requests.empty());
}

struct Batch {
  std::vector<EtcdEvent> events;
  std::int64_t revision;
};

TEST_CASE("client: watch streams events in order and reports compaction distinctly", "[etcd]") {
  Harness h(TwoEndpoints());
  h.script.answer = [](const HttpRequest& r) -> StatusOr<HttpResponse> {
    CHECK(json::parse(r.body)["create_request"]["start_revision"] == "3");
    return Answer(200,
                  "{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n"
                  "{\"result\":{\"header\":{\"revision\":\"5\"},\"events\":[{\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"4\",\"value\":\"MQ==\"}}]}}\n"
                  "{\"result\":{\"header\":{\"revision\":\"5\"},\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"5\"}}]}}\n"
                  "{\"result\":{\"header\":{\"revision\":\"9\"},\"canceled\":true,\"compact_revision\":\"8\"}}\n");
  };
  std::vector<Batch> got;
  Status s = h.client->Watch("a", "", 3, [&](const std::vector<EtcdEvent>& e, std::int64_t rev) { got.push_back({e, rev}); },
                             Background());
  CHECK(s.code() == kEtcdCompacted);
  CHECK(EtcdCompactRevision(s) == 8);
  REQUIRE(got.size() == 3);
  CHECK(got[0].events.empty());  // the watch is in place
  CHECK(got[0].revision == 5);
  CHECK(got[1].events.at(0) == EtcdEvent{EtcdEvent::kPut, {"a", "1", 0, 4, 0, 0}});
  CHECK(got[2].events.at(0).type == EtcdEvent::kDelete);
  CHECK(h.script.requests.size() == 1);
}

TEST_CASE("client: a watch stream that breaks or ends mid-frame is kUnavailable with where to resume", "[etcd]") {
  Harness h(TwoEndpoints());
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return Answer(200,
                  "{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n"
                  "{\"result\":{\"header\":{\"revision\":\"6\"},\"events\":[{\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"6\"}}]}}\n"
                  "{\"result\":{\"header\":{\"revision\":\"7\"},\"ev");
  };
  int batches = 0;
  Status s = h.client->Watch("a", "", 0, [&](const std::vector<EtcdEvent>&, std::int64_t) { ++batches; }, Background());
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(s.message().find("re-watch from 7") != std::string::npos);
  CHECK(s.message().find("http://a:2379") != std::string::npos);
  CHECK(batches == 2);
  CHECK(h.script.requests.size() == 1);  // established: the caller resumes, not us

  // A garbage frame ends the watch as an error, naming the endpoint.
  h.script.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return Answer(200, "{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n{\"result\":{\"events\":7}}\n");
  };
  Status bad = h.client->Watch("a", "", 0, [](const std::vector<EtcdEvent>&, std::int64_t) {}, Background());
  CHECK(bad.code() == StatusCode::kInternal);
  CHECK(bad.message().find("http://a:2379") != std::string::npos);
}

TEST_CASE("client: a watch refused for its token re-authenticates once", "[etcd]") {
  EtcdOptions o = TwoEndpoints();
  o.user = "root";
  o.password = "pw-secret";
  Harness h(o);
  int tokens = 0;
  h.script.answer = [&](const HttpRequest& r) -> StatusOr<HttpResponse> {
    if (r.url.find("/v3/auth/authenticate") != std::string::npos) {
      return Answer(200, fmt::format(R"({{"token":"t{}"}})", ++tokens));
    }
    if (tokens == 1) {
      return Answer(200, "{\"result\":{\"header\":{},\"watch_id\":\"-1\",\"created\":true,\"canceled\":true,"
                         "\"cancel_reason\":\"rpc error: code = Unauthenticated desc = etcdserver: invalid auth token\"}}\n");
    }
    return Answer(200, "{\"result\":{\"header\":{\"revision\":\"5\"},\"canceled\":true,\"compact_revision\":\"3\"}}\n");
  };
  Status s = h.client->Watch("a", "", 1, [](const std::vector<EtcdEvent>&, std::int64_t) {}, Background());
  CHECK(s.code() == kEtcdCompacted);
  CHECK(tokens == 2);
}

// Holds the request open until cancelled, like a watch with nothing to say.
struct Parked {
  std::mutex mu;
  std::condition_variable cv;
  bool parked = false, cancelled = false;
};

class ParkedHttp final : public HttpClient {
 public:
  explicit ParkedHttp(std::shared_ptr<Parked> p) : p_(std::move(p)) {}
  StatusOr<HttpResponse> Perform(const HttpRequest& request) override {
    std::unique_lock lk(p_->mu);
    p_->parked = true;
    p_->cv.notify_all();
    p_->cv.wait(lk, [this] { return p_->cancelled; });
    return CancelledError(request.url + ": cancelled");
  }
  void Cancel() override {
    std::lock_guard lk(p_->mu);
    p_->cancelled = true;
    p_->cv.notify_all();
  }

 private:
  std::shared_ptr<Parked> p_;
};

TEST_CASE("client: cancelling the context cuts a parked watch short through the HTTP client's Cancel", "[etcd]") {
  NoSleep sleeper;
  FixedClock clock;
  auto parked = std::make_shared<Parked>();
  auto client = MakeEtcdClient(TwoEndpoints(), sleeper, clock, [parked] { return std::make_unique<ParkedHttp>(parked); });
  CallContext ctx;
  ctx.cancel = std::make_shared<CancelSource>();
  Status result = InternalError("not returned");
  std::thread t([&] { result = client->Watch("a", "", 0, [](const std::vector<EtcdEvent>&, std::int64_t) {}, ctx); });
  {
    std::unique_lock lk(parked->mu);
    parked->cv.wait(lk, [&] { return parked->parked; });
  }
  ctx.cancel->Cancel();
  t.join();
  CHECK(result.ok());
  std::lock_guard lk(parked->mu);
  CHECK(parked->cancelled);
}

}  // namespace
}  // namespace spotvisor
