// The gang coordinator against a real etcd (Debian's etcd-server) on
// loopback: each "VM" is a coordinator with its own etcd client and
// keep-alive thread; they form, end and re-form generations together.
// Every wait is a condition with a bound. Exit 77 (skipped) without etcd.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <signal.h>

#include <cstdio>
#include <algorithm>
#include <atomic>
#include <future>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "etcd_process.h"
#include "gang/etcd_client.h"
#include "gang/gang.h"
#include "retry/sleeper.h"

namespace spotvisor {
namespace {

using namespace etcd_test;
using Steady = std::chrono::steady_clock;

SystemClock clock_;
CancellableSleeper sleeper_;

CallContext Within(std::chrono::milliseconds d, std::shared_ptr<CancelSource> cancel = nullptr) {
  CallContext c;
  c.cancel = std::move(cancel);
  c.clock = &clock_;
  c.deadline = clock_.Now() + d;
  return c;
}

long long MsSince(Steady::time_point t0, Steady::time_point t1) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t1 - t0).count();
}

std::unique_ptr<EtcdClient> Client(const Etcd& etcd) {
  EtcdOptions o;
  o.endpoints = {etcd.Url()};
  return MakeEtcdClient(std::move(o), sleeper_, clock_);
}

// How many watches etcd has open (its own gauge): lets a test start its
// stopwatch once every member is parked, instead of sleeping.
long WatcherCount(const Etcd& etcd) {
  auto http = MakeCurlHttpClient();
  HttpRequest req;
  req.url = etcd.Url() + "/metrics";
  req.timeout = 2s;
  auto r = http->Perform(req);
  if (!r.ok() || r->status != 200) return -1;
  const std::string name = "\netcd_debugging_mvcc_watcher_total ";
  auto at = r->body.find(name);
  if (at == std::string::npos) return -1;
  return std::strtol(r->body.c_str() + at + name.size(), nullptr, 10);
}

void WaitWatchers(const Etcd& etcd, long n) {
  bool parked = WaitFor(10s, [&] { return WatcherCount(etcd) >= n; });
  if (!parked) WARN("etcd does not show " << n << " watchers (watcher gauge " << WatcherCount(etcd) << ")");
}

// A result and when it arrived, from a call on its own thread.
template <typename T>
struct Timed {
  T value;
  Steady::time_point at;
};
template <typename Fn>
auto Async(Fn fn) {
  return std::async(std::launch::async, [fn] {
    auto v = fn();
    return Timed<decltype(v)>{std::move(v), Steady::now()};
  });
}

GangMember Member(std::string instance, std::string ip, std::string boot, std::string hash) {
  GangMember m;
  m.instance = std::move(instance);
  m.ip = std::move(ip);
  m.zone = "us-central1-a";
  m.boot_id = std::move(boot);
  m.command_hash = std::move(hash);
  m.gpus = 1;
  return m;
}

// One "VM": its own etcd client, its coordinator, and a keep-alive thread
// renewing its lease every TTL/3 as the daemon will.
class Vm {
 public:
  Vm(const Etcd& etcd, std::string instance, std::string ip, GangOptions o, std::string boot = "",
     std::string hash = "cmd-1")
      : etcd_(Client(etcd)), ttl_(o.member_ttl) {
    if (boot.empty()) boot = "boot-" + instance;
    coord_ = std::make_unique<GangCoordinator>(*etcd_, std::move(o), Member(std::move(instance), std::move(ip), std::move(boot), std::move(hash)),
                                               clock_, sleeper_);
  }
  ~Vm() { StopKeepAlive(); }

  Status Join() {
    Status s = coord_->Join(Within(10s));
    if (s.ok()) StartKeepAlive();
    return s;
  }
  // As if the VM's spotvisor were killed -9: nothing renews the lease.
  void StopKeepAlive() {
    if (!keepalive_.joinable()) return;
    stop_->Cancel();
    keepalive_.join();
  }
  GangCoordinator& c() { return *coord_; }
  int keepalive_failures() const { return failures_; }

 private:
  void StartKeepAlive() {
    StopKeepAlive();
    stop_ = std::make_shared<CancelSource>();
    keepalive_ = std::thread([this, stop = stop_] {
      auto every = std::chrono::duration_cast<std::chrono::milliseconds>(ttl_) / 3;
      while (stop->WaitFor(every)) {
        Status s = coord_->KeepAlive(Within(5s, stop));
        if (s.code() == StatusCode::kNotFound) return;
        if (!s.ok()) ++failures_;
      }
    });
  }

  std::unique_ptr<EtcdClient> etcd_;
  std::chrono::seconds ttl_;
  std::unique_ptr<GangCoordinator> coord_;
  std::shared_ptr<CancelSource> stop_ = std::make_shared<CancelSource>();
  std::thread keepalive_;
  std::atomic<int> failures_{0};
};

std::vector<std::string> ByRank(const Generation& g) {
  std::vector<std::string> out;
  for (const auto& m : g.members) out.push_back(m.instance);
  return out;
}

// All of `vms` wait for a generation at once; they must agree on it.
Generation FormTogether(std::vector<Vm*> vms, long long* latency_ms = nullptr, Steady::time_point t0 = Steady::now()) {
  std::vector<std::future<Timed<StatusOr<Generation>>>> f;
  for (Vm* vm : vms) f.push_back(Async([vm] { return vm->c().AwaitGeneration(Within(30s)); }));
  std::vector<Timed<StatusOr<Generation>>> got;
  for (auto& x : f) got.push_back(x.get());
  Steady::time_point last = t0;
  for (auto& g : got) {
    INFO(g.value.status().ToString());
    REQUIRE(g.value.ok());
    CHECK(*g.value == *got[0].value);
    last = std::max(last, g.at);
  }
  if (latency_ms) *latency_ms = MsSince(t0, last);
  return *got[0].value;
}

const std::vector<std::string> kRanksByIp = {"vm-b", "vm-c", "vm-a"};  // 10.0.0.1, .2, .3

TEST_CASE("three members form by IP, end together, lose one by lease expiry, re-form with the same ranks", "[it]") {
  TempDir dir;
  Etcd etcd(dir.path());
  auto admin = Client(etcd);
  GangOptions o{"train", 3, 2s};  // 2 s: etcd 3.4's shortest lease with default timing
  Vm a(etcd, "vm-a", "10.0.0.3", o), b(etcd, "vm-b", "10.0.0.1", o), c(etcd, "vm-c", "10.0.0.2", o);
  const std::string gen_key = GangPrefix("train") + "generation";

  // Formation: two wait, the third registers; all three get generation 1.
  REQUIRE(a.Join().ok());
  REQUIRE(b.Join().ok());
  auto fa = Async([&] { return a.c().AwaitGeneration(Within(30s)); });
  auto fb = Async([&] { return b.c().AwaitGeneration(Within(30s)); });
  WaitWatchers(etcd, 2);
  auto t0 = Steady::now();
  REQUIRE(c.Join().ok());
  auto joined = Steady::now();
  auto fc = Async([&] { return c.c().AwaitGeneration(Within(30s)); });
  auto ga = fa.get(), gb = fb.get(), gc = fc.get();
  REQUIRE(ga.value.ok());
  REQUIRE(gb.value.ok());
  REQUIRE(gc.value.ok());
  Generation g1 = *ga.value;
  CHECK(g1.number == 1);
  CHECK(*gb.value == g1);
  CHECK(*gc.value == g1);
  CHECK(ByRank(g1) == kRanksByIp);
  CHECK(g1.members[0].ip == "10.0.0.1");
  auto formed = std::max({ga.at, gb.at, gc.at});
  std::printf("formation: last member registered -> all three have generation 1: %lld ms (its Join took %lld ms)\n",
              MsSince(joined, formed), MsSince(t0, joined));
  // Exactly one commit landed: the key was written once.
  auto rec = admin->Range(gen_key, "", Within(5s));
  REQUIRE(rec.ok());
  REQUIRE(rec->first.size() == 1);
  CHECK(rec->first[0].version == 1);

  // One member ends it: everyone hears the same reason at once.
  auto ea = Async([&] { return a.c().AwaitEnd(g1, Within(30s)); });
  auto eb = Async([&] { return b.c().AwaitEnd(g1, Within(30s)); });
  auto ec = Async([&] { return c.c().AwaitEnd(g1, Within(30s)); });
  WaitWatchers(etcd, 3);
  auto t1 = Steady::now();
  auto won = b.c().EndGeneration(1, "preempted", Within(5s));
  REQUIRE(won.ok());
  CHECK(*won == "preempted");
  auto ra = ea.get(), rb = eb.get(), rc = ec.get();
  for (auto* r : {&ra, &rb, &rc}) {
    INFO(r->value.status().ToString());
    REQUIRE(r->value.ok());
    CHECK(*r->value == "preempted");
  }
  auto end_ms = MsSince(t1, std::max({ra.at, rb.at, rc.at}));
  std::printf("end: EndGeneration called -> all three AwaitEnd returned: %lld ms (per member %lld/%lld/%lld ms)\n", end_ms,
              MsSince(t1, ra.at), MsSince(t1, rb.at), MsSince(t1, rc.at));
  CHECK(end_ms < 1000);
  // A later reason does not replace the first.
  auto later = a.c().EndGeneration(1, "maintenance", Within(5s));
  REQUIRE(later.ok());
  CHECK(*later == "preempted");

  // Generation 2: the same members, the same ranks.
  long long reform_ms = 0;
  Generation g2 = FormTogether({&a, &b, &c}, &reform_ms);
  CHECK(g2.number == 2);
  CHECK(ByRank(g2) == kRanksByIp);
  std::printf("re-formation of the same three after an end: %lld ms\n", reform_ms);

  // vm-c's spotvisor "dies": its lease runs out, the others' AwaitEnd says so.
  auto la = Async([&] { return a.c().AwaitEnd(g2, Within(30s)); });
  auto lb = Async([&] { return b.c().AwaitEnd(g2, Within(30s)); });
  WaitWatchers(etcd, 2);
  auto t2 = Steady::now();
  c.StopKeepAlive();
  auto gone_a = la.get(), gone_b = lb.get();
  for (auto* r : {&gone_a, &gone_b}) {
    INFO(r->value.status().ToString());
    REQUIRE(r->value.ok());
    CHECK(*r->value == "member vm-c is gone");
  }
  auto gone_ms = MsSince(t2, std::max(gone_a.at, gone_b.at));
  std::printf("lease expiry: keep-alives stopped -> both survivors' AwaitEnd returned: %lld ms (TTL 2 s)\n", gone_ms);
  CHECK(gone_ms < 5000);
  CHECK(c.c().KeepAlive(Within(5s)).code() == StatusCode::kNotFound);
  CHECK(c.c().AwaitGeneration(Within(5s)).status().code() == StatusCode::kNotFound);

  // It comes back: generation 3 has the same ranks.
  REQUIRE(c.Join().ok());
  Generation g3 = FormTogether({&a, &b, &c});
  CHECK(g3.number == 3);
  CHECK(ByRank(g3) == kRanksByIp);

  // A fourth member, with the lowest IP of all, is a standby.
  Vm d(etcd, "vm-d", "10.0.0.0", o);
  REQUIRE(d.Join().ok());
  auto before = admin->Range(gen_key, "", Within(5s));
  REQUIRE(before.ok());
  auto standby = d.c().AwaitGeneration(Within(1500ms));
  CHECK(standby.status().code() == StatusCode::kDeadlineExceeded);
  auto after = admin->Range(gen_key, "", Within(5s));
  REQUIRE(after.ok());
  CHECK(after->first.at(0).mod_revision == before->first.at(0).mod_revision);

  // Cancelled from another thread while parked: back at once.
  {
    auto cancel = std::make_shared<CancelSource>();
    auto w = Async([&] { return d.c().AwaitGeneration(Within(30s, cancel)); });
    WaitWatchers(etcd, 1);
    auto t3 = Steady::now();
    cancel->Cancel();
    auto r = w.get();
    CHECK(r.value.status().code() == StatusCode::kCancelled);
    std::printf("cancel: AwaitGeneration returned %lld ms after Cancel\n", MsSince(t3, r.at));
    CHECK(MsSince(t3, r.at) < 500);
  }

  // vm-c leaves: the standby fills its rank, the others keep theirs.
  REQUIRE(c.c().Leave(Within(5s)).ok());
  Generation g4 = FormTogether({&a, &b, &d});
  CHECK(g4.number == 4);
  CHECK(ByRank(g4) == std::vector<std::string>{"vm-b", "vm-d", "vm-a"});
  auto end3 = admin->Range(GangPrefix("train") + "end/3", "", Within(5s));
  REQUIRE(end3.ok());
  REQUIRE(end3->first.size() == 1);
  CHECK(ParseEnd(end3->first[0].value)->reason == "member vm-c is gone");

  {
    auto cancel = std::make_shared<CancelSource>();
    auto w = Async([&] { return a.c().AwaitEnd(g4, Within(30s, cancel)); });
    WaitWatchers(etcd, 1);
    auto t4 = Steady::now();
    cancel->Cancel();
    auto r = w.get();
    CHECK(r.value.status().code() == StatusCode::kCancelled);
    std::printf("cancel: AwaitEnd returned %lld ms after Cancel\n", MsSince(t4, r.at));
    CHECK(MsSince(t4, r.at) < 500);
  }
  // Every commit was one write: generations 1..4, version 4.
  auto last = admin->Range(gen_key, "", Within(5s));
  REQUIRE(last.ok());
  CHECK(last->first.at(0).version == 4);
}

TEST_CASE("etcd down for longer than the TTL ends nothing: the generation is still in force when it returns", "[it]") {
  TempDir dir;
  Etcd etcd(dir.path());
  GangOptions o{"outage", 2, 2s};
  Vm a(etcd, "vm-a", "10.0.0.1", o), b(etcd, "vm-b", "10.0.0.2", o);
  REQUIRE(a.Join().ok());
  REQUIRE(b.Join().ok());
  Generation g = FormTogether({&a, &b});
  auto ea = Async([&] { return a.c().AwaitEnd(g, Within(90s)); });
  auto eb = Async([&] { return b.c().AwaitEnd(g, Within(90s)); });
  WaitWatchers(etcd, 2);

  auto t0 = Steady::now();
  etcd.Kill();
  // Down for longer than the TTL (the point of the case), and until both
  // members' keep-alives have failed.
  REQUIRE(WaitFor(30s, [&] {
    return Steady::now() - t0 > 3s && a.keepalive_failures() > 0 && b.keepalive_failures() > 0;
  }));
  auto down_ms = MsSince(t0, Steady::now());
  CHECK(down_ms > 2000);
  CHECK(ea.wait_for(0s) == std::future_status::timeout);  // the trainers would keep running
  CHECK(eb.wait_for(0s) == std::future_status::timeout);
  etcd.Start();

  // etcd renews every lease when it comes back: nobody is gone, and the
  // generation ends only when a member says so.
  auto lease_ok = WaitFor(15s, [&] { return a.c().KeepAlive(Within(2s)).ok() && b.c().KeepAlive(Within(2s)).ok(); });
  CHECK(lease_ok);
  auto won = a.c().EndGeneration(g.number, "done after the outage", Within(10s));
  REQUIRE(won.ok());
  CHECK(*won == "done after the outage");
  auto ra = ea.get(), rb = eb.get();
  INFO(ra.value.status().ToString() << " / " << rb.value.status().ToString());
  REQUIRE(ra.value.ok());
  REQUIRE(rb.value.ok());
  CHECK(*ra.value == "done after the outage");
  CHECK(*rb.value == "done after the outage");
  std::printf("etcd outage: down %lld ms (TTL 2 s); the generation survived it\n", down_ms);
}

TEST_CASE("end-to-all latency over 20 generations of 4 members", "[it]") {
  TempDir dir;
  Etcd etcd(dir.path());
  GangOptions o{"latency", 4, 10s};
  Vm v0(etcd, "vm-0", "10.0.1.4", o), v1(etcd, "vm-1", "10.0.1.3", o), v2(etcd, "vm-2", "10.0.1.2", o),
      v3(etcd, "vm-3", "10.0.1.1", o);
  std::vector<Vm*> vms = {&v0, &v1, &v2, &v3};
  for (Vm* vm : vms) REQUIRE(vm->Join().ok());
  std::vector<long long> ends, forms;
  std::vector<std::string> ranks;
  for (int i = 0; i < 20; ++i) {
    long long form_ms = 0;
    Generation g = FormTogether(vms, &form_ms);
    forms.push_back(form_ms);
    CHECK(g.number == i + 1);
    if (i == 0) ranks = ByRank(g);
    CHECK(ByRank(g) == ranks);
    std::vector<std::future<Timed<StatusOr<std::string>>>> f;
    for (Vm* vm : vms) f.push_back(Async([vm, g] { return vm->c().AwaitEnd(g, Within(30s)); }));
    WaitWatchers(etcd, 4);
    auto t0 = Steady::now();
    std::string why = fmt::format("preempted {}", i);
    REQUIRE(vms[i % 4]->c().EndGeneration(g.number, why, Within(5s)).value() == why);
    Steady::time_point last = t0;
    for (auto& x : f) {
      auto r = x.get();
      REQUIRE(r.value.ok());
      CHECK(*r.value == why);
      last = std::max(last, r.at);
    }
    ends.push_back(MsSince(t0, last));
  }
  CHECK(ranks == std::vector<std::string>{"vm-3", "vm-2", "vm-1", "vm-0"});
  std::sort(ends.begin(), ends.end());
  std::sort(forms.begin(), forms.end());
  std::printf("20 generations of 4: end -> all four AwaitEnd returned p50 %lld ms, max %lld ms; re-formation p50 %lld ms, max %lld ms\n",
              ends[ends.size() / 2], ends.back(), forms[forms.size() / 2], forms.back());
  CHECK(ends.back() < 1000);
}

TEST_CASE("formation is refused, naming both, for a different size or command, and a name is held by one machine", "[it]") {
  TempDir dir;
  Etcd etcd(dir.path());
  GangOptions three{"g-size", 3, 10s}, four{"g-size", 4, 10s};
  {
    Vm a(etcd, "vm-a", "10.0.0.1", three), b(etcd, "vm-b", "10.0.0.2", four);
    REQUIRE(a.Join().ok());
    REQUIRE(b.Join().ok());
    auto r = a.c().AwaitGeneration(Within(10s));
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    INFO(r.status().message());
    CHECK(r.status().message().find("\"vm-a\" (\"10.0.0.1\") has 3") != std::string::npos);
    CHECK(r.status().message().find("\"vm-b\" (\"10.0.0.2\") has 4") != std::string::npos);
    CHECK(b.c().AwaitGeneration(Within(10s)).status().code() == StatusCode::kFailedPrecondition);
  }
  {
    GangOptions o{"g-cmd", 2, 10s};
    Vm a(etcd, "vm-a", "10.0.0.1", o, "", "hash-one"), b(etcd, "vm-b", "10.0.0.2", o, "", "hash-two");
    REQUIRE(a.Join().ok());
    REQUIRE(b.Join().ok());
    auto r = b.c().AwaitGeneration(Within(10s));
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    INFO(r.status().message());
    for (const char* s : {"vm-a", "vm-b", "hash-one", "hash-two"}) CHECK(r.status().message().find(s) != std::string::npos);
    auto none = Client(etcd)->Range(GangPrefix("g-cmd") + "generation", "", Within(5s));
    REQUIRE(none.ok());
    CHECK(none->first.empty());
  }
  {
    GangOptions o{"g-dup", 2, 10s};
    Vm first(etcd, "vm-x", "10.0.0.5", o, "boot-1");
    REQUIRE(first.Join().ok());
    Vm other(etcd, "vm-x", "10.0.0.6", o, "boot-2");
    Status s = other.Join();
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    INFO(s.message());
    for (const char* w : {"\"vm-x\"", "boot-1", "boot-2", "10.0.0.5", "10.0.0.6"}) CHECK(s.message().find(w) != std::string::npos);
    // The record is still the first machine's.
    auto held = Client(etcd)->Range(GangPrefix("g-dup") + "members/vm-x", "", Within(5s));
    REQUIRE(held.ok());
    CHECK(ParseMember(held->first.at(0).value)->boot_id == "boot-1");
    // The same boot registering again (spotvisor restarted) takes it over.
    Vm restarted(etcd, "vm-x", "10.0.0.5", o, "boot-1");
    REQUIRE(restarted.Join().ok());
    auto now = Client(etcd)->Range(GangPrefix("g-dup") + "members/vm-x", "", Within(5s));
    REQUIRE(now.ok());
    CHECK(now->first.at(0).lease != held->first.at(0).lease);
    CHECK(now->first.at(0).create_revision == held->first.at(0).create_revision);
  }
}

}  // namespace
}  // namespace spotvisor

int main(int argc, char** argv) {
  if (spotvisor::etcd_test::FindOnPath("etcd").empty()) {
    std::fprintf(stderr, "skipped: etcd is not installed (apt-get install etcd-server), nor named by ETCD_BIN\n");
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  return Catch::Session().run(argc, argv);
}
