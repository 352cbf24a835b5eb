// The etcd client against a real etcd (Debian's etcd-server) on loopback:
// each case starts its own etcd in a temp dir on free ports and stops it.
// Exit 77 (skipped) when etcd is not installed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gang/etcd_client.h"
#include "etcd_process.h"
#include "retry/sleeper.h"
#include "storage/crc32c.h"

namespace spotvisor {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using namespace etcd_test;

SystemClock clock_;
CancellableSleeper sleeper_;

CallContext Within(std::chrono::milliseconds d, std::shared_ptr<CancelSource> cancel = nullptr) {
  CallContext c;
  c.cancel = std::move(cancel);
  c.clock = &clock_;
  c.deadline = clock_.Now() + d;
  return c;
}

std::unique_ptr<EtcdClient> Client(std::vector<std::string> endpoints, EtcdOptions o = {}) {
  o.endpoints = std::move(endpoints);
  return MakeEtcdClient(std::move(o), sleeper_, clock_);
}

// Collects watch batches from a Watch running on its own thread.
class Watcher {
 public:
  Watcher(EtcdClient& c, std::string key, std::string range_end, std::int64_t from, CallContext ctx) {
    ctx.cancel = cancel_;
    done_ = std::async(std::launch::async, [this, &c, key, range_end, from, ctx] {
      Status s = c.Watch(key, range_end, from,
                         [this](const std::vector<EtcdEvent>& ev, std::int64_t) {
                           std::lock_guard lk(mu_);
                           if (ev.empty()) established_ = true;
                           events_.insert(events_.end(), ev.begin(), ev.end());
                           cv_.notify_all();
                         },
                         ctx);
      returned_at_ = std::chrono::steady_clock::now();
      return s;
    });
  }
  ~Watcher() {
    cancel_->Cancel();
    if (done_.valid()) done_.wait();
  }
  bool WaitEstablished(std::chrono::milliseconds bound) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, bound, [&] { return established_; });
  }
  bool WaitEvents(std::size_t n, std::chrono::milliseconds bound) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, bound, [&] { return events_.size() >= n; });
  }
  std::vector<EtcdEvent> Events() {
    std::lock_guard lk(mu_);
    return events_;
  }
  // The watch's status, waiting up to `bound` for it to return.
  std::optional<Status> Result(std::chrono::milliseconds bound) {
    if (done_.wait_for(bound) != std::future_status::ready) return std::nullopt;
    return done_.get();
  }
  CancelSource& cancel() { return *cancel_; }
  std::chrono::steady_clock::time_point returned_at() const { return returned_at_; }

 private:
  std::shared_ptr<CancelSource> cancel_ = std::make_shared<CancelSource>();
  std::mutex mu_;
  std::condition_variable cv_;
  bool established_ = false;
  std::vector<EtcdEvent> events_;
  std::future<Status> done_;
  std::chrono::steady_clock::time_point returned_at_;
};

std::vector<std::string> Keys(const std::vector<EtcdKv>& kvs) {
  std::vector<std::string> k;
  for (auto const& kv : kvs) k.push_back(kv.key);
  return k;
}

TEST_CASE("put, range, prefix range, delete, and txn compares against etcd", "[it]") {
  TempDir dir;
  Etcd etcd(dir.path());
  auto c = Client({etcd.Url()});

  auto r1 = c->Put("gang/g1/members/a", "10.0.0.1", 0, Within(5s));
  REQUIRE(r1.ok());
  auto r2 = c->Put("gang/g1/members/b", std::string("bin\0\xff", 5), 0, Within(5s));
  REQUIRE(r2.ok());
  CHECK(*r2 == *r1 + 1);
  REQUIRE(c->Put("gang/g10/x", "other gang", 0, Within(5s)).ok());

  auto one = c->Range("gang/g1/members/a", "", Within(5s));
  REQUIRE(one.ok());
  REQUIRE(one->first.size() == 1);
  CHECK(one->first[0].value == "10.0.0.1");
  CHECK(one->first[0].create_revision == *r1);
  CHECK(one->first[0].version == 1);
  CHECK(one->second == *r2 + 1);

  auto prefix = c->Range("gang/g1/", PrefixEnd("gang/g1/"), Within(5s));
  REQUIRE(prefix.ok());
  CHECK(Keys(prefix->first) == std::vector<std::string>{"gang/g1/members/a", "gang/g1/members/b"});
  CHECK(prefix->first[1].value == std::string("bin\0\xff", 5));

  auto missing = c->Range("nope", "", Within(5s));
  REQUIRE(missing.ok());
  CHECK(missing->first.empty());

  // create_revision == 0 -> put, else read: the first wins, the second reads the winner.
  std::vector<EtcdCompare> absent = {{EtcdCompare::kCreate, EtcdCompare::kEqual, "gang/g1/leader", 0, ""}};
  auto won = c->Txn(absent, {{EtcdOp::kPut, "gang/g1/leader", "a", "", 0}}, {{EtcdOp::kRange, "gang/g1/leader", "", "", 0}},
                    Within(5s));
  REQUIRE(won.ok());
  CHECK(won->succeeded);
  CHECK(won->ranges.empty());
  auto lost = c->Txn(absent, {{EtcdOp::kPut, "gang/g1/leader", "b", "", 0}}, {{EtcdOp::kRange, "gang/g1/leader", "", "", 0}},
                     Within(5s));
  REQUIRE(lost.ok());
  CHECK_FALSE(lost->succeeded);
  REQUIRE(lost->ranges.size() == 1);
  REQUIRE(lost->ranges[0].size() == 1);
  CHECK(lost->ranges[0][0].value == "a");
  CHECK(lost->revision == won->revision);
  // A compare on value and mod revision, and a delete inside a txn.
  auto mod = lost->ranges[0][0].mod_revision;
  auto cas = c->Txn({{EtcdCompare::kMod, EtcdCompare::kEqual, "gang/g1/leader", mod, ""},
                     {EtcdCompare::kValue, EtcdCompare::kEqual, "gang/g1/leader", 0, "a"}},
                    {{EtcdOp::kPut, "gang/g1/leader", "c", "", 0}, {EtcdOp::kDelete, "gang/g10/x", "", "", 0},
                     {EtcdOp::kRange, "gang/", "", PrefixEnd("gang/"), 0}},
                    {}, Within(5s));
  REQUIRE(cas.ok());
  CHECK(cas->succeeded);
  REQUIRE(cas->ranges.size() == 1);
  CHECK(Keys(cas->ranges[0]) == std::vector<std::string>{"gang/g1/leader", "gang/g1/members/a", "gang/g1/members/b"});

  auto deleted = c->Delete("gang/g1/members/", PrefixEnd("gang/g1/members/"), Within(5s));
  REQUIRE(deleted.ok());
  CHECK(*deleted == 2);
  auto again = c->Delete("gang/g1/members/a", "", Within(5s));
  REQUIRE(again.ok());
  CHECK(*again == 0);

  // etcd's own refusals keep their meaning.
  auto no_lease = c->Put("k", "v", 12345, Within(5s));
  CHECK(no_lease.status().code() == StatusCode::kNotFound);
  CHECK(no_lease.status().message().find("requested lease not found") != std::string::npos);
  CHECK(no_lease.status().message().find(etcd.Url()) != std::string::npos);
  CHECK(c->Put("", "v", 0, Within(5s)).status().code() == StatusCode::kInvalidArgument);

  // Credentials for an etcd without auth are no error (as with clientv3).
  EtcdOptions creds;
  creds.user = "root";
  creds.password = "unused-password";
  auto with_creds = Client({etcd.Url()}, creds);
  REQUIRE(with_creds->Put("k", "v", 0, Within(5s)).ok());
  REQUIRE(with_creds->Range("k", "", Within(5s)).ok());
}

TEST_CASE("leases: grant, keep-alive, expiry takes the key, revoke", "[it]") {
  TempDir dir;
  Etcd etcd(dir.path());
  auto c = Client({etcd.Url()});

  auto lease = c->LeaseGrant(2s, Within(5s));
  REQUIRE(lease.ok());
  REQUIRE(c->Put("member/a", "alive", *lease, Within(5s)).ok());
  auto kv = c->Range("member/a", "", Within(5s));
  REQUIRE(kv.ok());
  CHECK(kv->first.at(0).lease == *lease);
  auto ttl = c->LeaseKeepAlive(*lease, Within(5s));
  REQUIRE(ttl.ok());
  CHECK(*ttl == 2s);
  auto left = c->LeaseTimeToLive(*lease, Within(5s));
  REQUIRE(left.ok());
  CHECK(*left <= 2s);

  // No more keep-alives: etcd expires the lease and deletes the key.
  auto start = std::chrono::steady_clock::now();
  bool gone = WaitFor(10s, [&] {
    auto r = c->Range("member/a", "", Within(5s));
    return r.ok() && r->first.empty();
  });
  CHECK(gone);
  INFO("expired after " << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count() << " ms");
  CHECK(c->LeaseKeepAlive(*lease, Within(5s)).status().code() == StatusCode::kNotFound);
  CHECK(c->LeaseTimeToLive(*lease, Within(5s)).status().code() == StatusCode::kNotFound);

  auto l2 = c->LeaseGrant(60s, Within(5s));
  REQUIRE(l2.ok());
  REQUIRE(c->Put("member/b", "alive", *l2, Within(5s)).ok());
  REQUIRE(c->LeaseRevoke(*l2, Within(5s)).ok());
  auto b = c->Range("member/b", "", Within(5s));
  REQUIRE(b.ok());
  CHECK(b->first.empty());
  CHECK(c->LeaseRevoke(*l2, Within(5s)).code() == StatusCode::kNotFound);
  CHECK(c->LeaseKeepAlive(*l2, Within(5s)).status().code() == StatusCode::kNotFound);
}

TEST_CASE("watch: events from another client in order, resume, compaction, prompt cancel", "[it]") {
  TempDir dir;
  Etcd etcd(dir.path());
  auto c = Client({etcd.Url()});
  auto other = Client({etcd.Url()});
  auto now = c->Range("w/", PrefixEnd("w/"), Within(5s));
  REQUIRE(now.ok());
  std::int64_t from = now->second + 1;

  std::int64_t put2 = 0;
  {
    Watcher w(*c, "w/", PrefixEnd("w/"), from, Within(30s));
    REQUIRE(w.WaitEstablished(5s));
    REQUIRE(other->Put("w/a", "1", 0, Within(5s)).ok());
    REQUIRE(other->Put("outside", "x", 0, Within(5s)).ok());
    auto p2 = other->Put("w/a", "2", 0, Within(5s));
    REQUIRE(p2.ok());
    put2 = *p2;
    REQUIRE(other->Delete("w/a", "", Within(5s)).ok());
    REQUIRE(w.WaitEvents(3, 5s));
    auto ev = w.Events();
    REQUIRE(ev.size() == 3);
    CHECK(ev[0].type == EtcdEvent::kPut);
    CHECK(ev[0].kv.value == "1");
    CHECK(ev[1].kv.value == "2");
    CHECK(ev[1].kv.mod_revision == put2);
    CHECK(ev[2].type == EtcdEvent::kDelete);
    CHECK(ev[2].kv.key == "w/a");
    CHECK(ev[0].kv.mod_revision < ev[1].kv.mod_revision);
    CHECK(ev[1].kv.mod_revision < ev[2].kv.mod_revision);

    // Cancelled from this thread while parked: back within 200 ms.
    auto t0 = std::chrono::steady_clock::now();
    w.cancel().Cancel();
    auto s = w.Result(5s);
    REQUIRE(s.has_value());
    CHECK(s->ok());
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(w.returned_at() - t0);
    INFO("cancel took " << took.count() << " ms");
    CHECK(took < 200ms);
  }

  // Resume from a revision: the events from there on, history included.
  {
    Watcher w(*c, "w/a", "", put2, Within(30s));
    REQUIRE(w.WaitEvents(2, 5s));
    auto ev = w.Events();
    CHECK(ev.at(0).kv.value == "2");
    CHECK(ev.at(1).type == EtcdEvent::kDelete);
  }

  // The deadline ends a quiet watch with OkStatus.
  {
    auto t0 = std::chrono::steady_clock::now();
    Status s = c->Watch("quiet", "", 0, [](const std::vector<EtcdEvent>&, std::int64_t) {}, Within(300ms));
    CHECK(s.ok());
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  }

  // Compacted history is reported distinctly, with the compact revision.
  auto head = c->Range("w/", "", Within(5s));
  REQUIRE(head.ok());
  etcd.Raw("/v3/kv/compaction", {{"revision", std::to_string(head->second)}, {"physical", true}});
  Status compacted = c->Watch("w/", PrefixEnd("w/"), from, [](const std::vector<EtcdEvent>&, std::int64_t) {}, Within(10s));
  CHECK(compacted.code() == kEtcdCompacted);
  CHECK(EtcdCompactRevision(compacted) == head->second);
  INFO(compacted.message());
  CHECK(compacted.message().find(etcd.Url()) != std::string::npos);
}

TEST_CASE("failover: a dead first endpoint, then etcd killed mid-watch and restarted", "[it]") {
  TempDir dir;
  Etcd etcd(dir.path());
  std::string dead = fmt::format("http://127.0.0.1:{}", FreePort());
  auto c = Client({dead, etcd.Url()});
  auto rev = c->Put("f/k", "v", 0, Within(5s));
  REQUIRE(rev.ok());
  auto r = c->Range("f/k", "", Within(5s));
  REQUIRE(r.ok());
  CHECK(r->first.at(0).value == "v");

  // Only the dead endpoint: the error names it.
  auto only_dead = Client({dead});
  auto err = only_dead->Range("f/k", "", Within(3s));
  REQUIRE_FALSE(err.ok());
  CHECK(err.status().message().find(dead) != std::string::npos);

  std::optional<Status> broke;
  {
    Watcher w(*c, "f/", PrefixEnd("f/"), 0, Within(60s));
    REQUIRE(w.WaitEstablished(5s));
    etcd.Kill();
    broke = w.Result(10s);
    REQUIRE(broke.has_value());
  }
  CHECK(broke->code() == StatusCode::kUnavailable);
  INFO(broke->message());
  CHECK(broke->message().find(etcd.Url()) != std::string::npos);
  // Down: calls fail, naming the endpoints, within their bound.
  auto down = c->Range("f/k", "", Within(2s));
  CHECK_FALSE(down.ok());

  etcd.Start();
  auto back = c->Range("f/k", "", Within(5s));
  REQUIRE(back.ok());
  CHECK(back->first.at(0).value == "v");
  Watcher w(*c, "f/", PrefixEnd("f/"), back->second + 1, Within(30s));
  REQUIRE(w.WaitEstablished(5s));
  REQUIRE(c->Put("f/after", "1", 0, Within(5s)).ok());
  REQUIRE(w.WaitEvents(1, 5s));
  CHECK(w.Events().at(0).kv.key == "f/after");
}

Tls MakeCerts(const std::string& dir) {
  Tls t{dir + "/ca.crt", dir + "/server.crt", dir + "/server.key", dir + "/client.crt", dir + "/client.key"};
  std::ofstream(dir + "/server.ext") << "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n";
  std::ofstream(dir + "/client.ext") << "extendedKeyUsage=clientAuth\n";
  std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::string script = fmt::format(
      "set -e; cd {0}; "
      "openssl req -x509 {1} -keyout ca.key -out ca.crt -days 1 -subj /CN=spotvisor-test-ca; "
      "openssl req {1} -keyout server.key -out server.csr -subj /CN=127.0.0.1; "
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 1 -extfile server.ext; "
      "openssl req {1} -keyout client.key -out client.csr -subj /CN=gang-member; "
      "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 1 -extfile client.ext",
      dir, key);
  std::string cmd = "bash -c '" + script + "' >" + dir + "/openssl.log 2>&1";
  INFO(cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
  return t;
}

TEST_CASE("TLS with client certificates", "[it]") {
  TempDir dir;
  Tls tls = MakeCerts(dir.path());
  Etcd etcd(dir.path(), tls);
  EtcdOptions o;
  o.ca_file = tls.ca;
  o.cert_file = tls.client_cert;
  o.key_file = tls.client_key;
  auto c = Client({etcd.Url()}, o);
  REQUIRE(c->Put("tls/k", "secret value", 0, Within(5s)).ok());
  auto r = c->Range("tls/k", "", Within(5s));
  REQUIRE(r.ok());
  CHECK(r->first.at(0).value == "secret value");
  {
    Watcher w(*c, "tls/", PrefixEnd("tls/"), r->second + 1, Within(30s));
    REQUIRE(w.WaitEstablished(5s));
    REQUIRE(c->Put("tls/k2", "v", 0, Within(5s)).ok());
    REQUIRE(w.WaitEvents(1, 5s));
  }

  // Without the client certificate etcd refuses; without the CA we refuse etcd.
  EtcdOptions no_cert;
  no_cert.ca_file = tls.ca;
  auto refused = Client({etcd.Url()}, no_cert)->Range("tls/k", "", Within(3s));
  CHECK(refused.status().code() == StatusCode::kPermissionDenied);
  INFO(refused.status().message());
  CHECK(refused.status().message().find("client certificate") != std::string::npos);
  CHECK(refused.status().message().find(etcd.Url()) != std::string::npos);
  EtcdOptions no_ca;
  no_ca.cert_file = tls.client_cert;
  no_ca.key_file = tls.client_key;
  auto untrusted = Client({etcd.Url()}, no_ca)->Range("tls/k", "", Within(3s));
  CHECK_FALSE(untrusted.ok());
}

TEST_CASE("user and password auth; a wrong password is named, never shown", "[it]") {
  TempDir dir;
  Etcd etcd(dir.path());
  const std::string password = "Corr3ct-Horse-Battery";
  etcd.Raw("/v3/auth/user/add", {{"name", "root"}, {"password", password}});
  etcd.Raw("/v3/auth/role/add", {{"name", "root"}});
  etcd.Raw("/v3/auth/user/grant", {{"user", "root"}, {"role", "root"}});
  etcd.Raw("/v3/auth/enable", json::object());

  EtcdOptions o;
  o.user = "root";
  o.password = password;
  auto c = Client({etcd.Url()}, o);
  REQUIRE(c->Put("auth/k", "v", 0, Within(10s)).ok());
  auto r = c->Range("auth/k", "", Within(10s));
  REQUIRE(r.ok());
  CHECK(r->first.at(0).value == "v");
  auto lease = c->LeaseGrant(30s, Within(10s));
  REQUIRE(lease.ok());
  REQUIRE(c->LeaseKeepAlive(*lease, Within(10s)).ok());
  {
    Watcher w(*c, "auth/", PrefixEnd("auth/"), r->second + 1, Within(30s));
    REQUIRE(w.WaitEstablished(10s));
    REQUIRE(c->Put("auth/k2", "v", 0, Within(10s)).ok());
    REQUIRE(w.WaitEvents(1, 5s));
  }

  // No credentials: etcd's refusal, and what to do about it.
  auto anon = Client({etcd.Url()})->Range("auth/k", "", Within(10s));
  CHECK(anon.status().code() == StatusCode::kPermissionDenied);
  CHECK(anon.status().message().find("user and password") != std::string::npos);

  EtcdOptions bad = o;
  bad.password = "Wr0ng-Password-Here";
  auto wrong = Client({etcd.Url()}, bad)->Range("auth/k", "", Within(10s));
  REQUIRE_FALSE(wrong.ok());
  INFO(wrong.status().message());
  CHECK(wrong.status().code() == StatusCode::kPermissionDenied);
  CHECK(wrong.status().message().find("authentication failed") != std::string::npos);
  CHECK(wrong.status().message().find("\"root\"") != std::string::npos);
  CHECK(wrong.status().message().find("Wr0ng-Password-Here") == std::string::npos);
  CHECK(wrong.status().message().find(password) == std::string::npos);

  // etcd's simple tokens live in its memory: after a restart the client's
  // token is refused and it authenticates again by itself.
  // A write refused for its token was not applied, so it is sent again.
  etcd.Kill();
  etcd.Start();
  auto wr = c->Put("auth/k3", "v3", 0, Within(10s));
  REQUIRE(wr.ok());
  auto after = c->Range("auth/k3", "", Within(10s));
  REQUIRE(after.ok());
  CHECK(after->first.at(0).value == "v3");
  CHECK(after->first.at(0).version == 1);
}

}  // namespace
}  // namespace spotvisor

int main(int argc, char** argv) {
  if (spotvisor::etcd_test::FindOnPath("etcd").empty()) {
    std::fprintf(stderr, "skipped: etcd is not installed (apt-get install etcd-server), nor named by ETCD_BIN\n");
    return 77;
  }
  if (spotvisor::etcd_test::FindOnPath("openssl").empty()) {
    std::fprintf(stderr, "skipped: openssl is not installed (the TLS case makes its certificates with it)\n");
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  return Catch::Session().run(argc, argv);
}
