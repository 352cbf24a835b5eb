#include "gang/gang.h"

#include <catch2/catch.hpp>

#include <map>
#include <set>

namespace spotvisor {
namespace {

GangMember M(std::string instance, std::string ip, int size = 3, std::string hash = "h1") {
  GangMember m;
  m.instance = std::move(instance);
  m.ip = std::move(ip);
  m.zone = "us-central1-a";
  m.boot_id = "boot-" + m.instance;
  m.command_hash = std::move(hash);
  m.gpus = 1;
  m.size = size;
  return m;
}

std::vector<std::string> Names(const std::vector<RankedMember>& r) {
  std::vector<std::string> out;
  for (const auto& m : r) out.push_back(m.instance);
  return out;
}

using Names_ = std::vector<std::string>;

TEST_CASE("AssignRanks without a previous generation: by IPv4 as a number, lowest is rank 0", "[gang]") {
  auto r = AssignRanks({M("c", "10.0.0.3"), M("a10", "10.0.0.10"), M("b", "10.0.0.9"), M("z", "10.0.0.1")}, 4, std::nullopt);
  REQUIRE(r.size() == 4);
  CHECK(Names(r) == Names_{"z", "c", "b", "a10"});  // 10.0.0.10 after 10.0.0.9: numbers, not strings
  for (int i = 0; i < 4; ++i) CHECK(r[i].rank == i);
  CHECK(r[0].ip == "10.0.0.1");
}

TEST_CASE("AssignRanks: non-IPv4 addresses after IPv4 ones, by string, then instance name", "[gang]") {
  auto r = AssignRanks({M("v6", "fd00::1"), M("host", "node-b"), M("y", "192.168.1.1"), M("x", "192.168.1.1"), M("p", "10.1.2.3")}, 5,
                       std::nullopt);
  CHECK(Names(r) == Names_{"p", "x", "y", "v6", "host"});
}

TEST_CASE("AssignRanks keeps the previous ranks of live instances and fills gaps by IP", "[gang]") {
  Generation prev{1, "t", {{"c", "10.0.0.3", 0}, {"a", "10.0.0.1", 1}, {"b", "10.0.0.2", 2}}, ""};
  SECTION("the same members come back, one with a new IP: same ranks, the new IP") {
    auto r = AssignRanks({M("a", "10.0.0.1"), M("b", "10.0.0.2"), M("c", "10.0.0.99")}, 3, prev);
    CHECK(Names(r) == Names_{"c", "a", "b"});
    CHECK(r[0].ip == "10.0.0.99");
  }
  SECTION("a gap is filled by the lowest-IP newcomer; the rest are standbys") {
    auto r = AssignRanks({M("a", "10.0.0.1"), M("c", "10.0.0.3"), M("e", "10.0.0.8"), M("d", "10.0.0.7")}, 3, prev);
    REQUIRE(r.size() == 3);
    CHECK(Names(r) == Names_{"c", "a", "d"});
    CHECK(r[2].rank == 2);
  }
  SECTION("an extra member with the lowest IP does not take a kept rank") {
    auto r = AssignRanks({M("a", "10.0.0.1"), M("b", "10.0.0.2"), M("c", "10.0.0.3"), M("zero", "10.0.0.0")}, 3, prev);
    CHECK(Names(r) == Names_{"c", "a", "b"});
  }
  SECTION("fewer live than size: the ranks that can be given, gaps and all") {
    auto r = AssignRanks({M("b", "10.0.0.2")}, 3, prev);
    REQUIRE(r.size() == 1);
    CHECK(r[0].rank == 2);
  }
  SECTION("a smaller gang: ranks beyond it are given again") {
    auto r = AssignRanks({M("a", "10.0.0.1"), M("b", "10.0.0.2"), M("c", "10.0.0.3")}, 2, prev);
    CHECK(Names(r) == Names_{"c", "a"});
  }
  SECTION("a hostile previous record (bad ranks, duplicates) does not break it") {
    Generation odd{2, "t", {{"a", "x", 7}, {"b", "x", -1}, {"c", "x", 1}, {"c", "x", 0}}, ""};
    auto r = AssignRanks({M("a", "10.0.0.1"), M("b", "10.0.0.2"), M("c", "10.0.0.3")}, 3, odd);
    CHECK(Names(r) == Names_{"a", "c", "b"});
  }
  CHECK(AssignRanks({M("a", "10.0.0.1")}, 0, prev).empty());
}

TEST_CASE("CheckAgreement names both sides and both values", "[gang]") {
  auto self = M("vm-a", "10.0.0.1", 3, "h1");
  CHECK(CheckAgreement("g", self, {self, M("vm-b", "10.0.0.2", 3, "h1")}).ok());
  Status size = CheckAgreement("g", self, {self, M("vm-b", "10.0.0.2", 4, "h1")});
  CHECK(size.code() == StatusCode::kFailedPrecondition);
  INFO(size.message());
  CHECK(size.message().find("\"vm-a\" (\"10.0.0.1\") has 3") != std::string::npos);
  CHECK(size.message().find("\"vm-b\" (\"10.0.0.2\") has 4") != std::string::npos);
  Status cmd = CheckAgreement("g", self, {M("vm-c", "10.0.0.3", 3, "other")});
  CHECK(cmd.code() == StatusCode::kFailedPrecondition);
  INFO(cmd.message());
  CHECK(cmd.message().find("\"vm-a\"") != std::string::npos);
  CHECK(cmd.message().find("\"vm-c\"") != std::string::npos);
  CHECK(cmd.message().find("\"h1\"") != std::string::npos);
  CHECK(cmd.message().find("\"other\"") != std::string::npos);
  // Bytes that are not text are shown, not thrown on.
  CHECK_FALSE(CheckAgreement("g", self, {M(std::string("v\xff", 2), "10.0.0.3", 3, std::string("\xc0", 1))}).ok());
}

TEST_CASE("two runs under one gang name never form one gang: run-id, bucket, checkpoint and launch must agree", "[gang]") {
  auto self = M("vm-a", "10.0.0.1", 2, "h1");
  self.run_id = "run-a";
  self.bucket = "gs://b/exp";
  self.checkpoint = "leader";
  self.launch = "each";
  auto other = self;
  other.instance = "vm-b";
  other.ip = "10.0.0.2";
  CHECK(CheckAgreement("g", self, {self, other}).ok());
  auto refused = [&](std::string GangMember::*field, const std::string& value, const std::string& key) {
    auto m = other;
    m.*field = value;
    Status s = CheckAgreement("g", self, {self, m});
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    INFO(s.message());
    CHECK(s.message().find("disagree on " + key) != std::string::npos);
    CHECK(s.message().find("\"" + self.*field + "\"") != std::string::npos);
    CHECK(s.message().find("\"" + value + "\"") != std::string::npos);
  };
  refused(&GangMember::run_id, "run-b", "run-id");
  refused(&GangMember::bucket, "gs://other/exp", "bucket");
  refused(&GangMember::checkpoint, "all", "gang-checkpoint");
  refused(&GangMember::launch, "leader", "gang-launch");
  // A member that does not say (an older spotvisor) is not refused for it.
  auto old = other;
  old.run_id.clear();
  CHECK(CheckAgreement("g", self, {self, old}).ok());
}

TEST_CASE("member records round-trip and are checked", "[gang]") {
  auto m = M("vm-a", "10.0.0.1");
  m.run_id = "r";
  m.bucket = "gs://b";
  m.checkpoint = "all";
  m.launch = "leader";
  auto back = ParseMember(MemberJson(m));
  REQUIRE(back.ok());
  CHECK(*back == m);
  for (const char* bad : {"", "null", "[]", "{", R"({"ip":"1","size":3,"gpus":0})", R"({"instance":"","ip":"1","size":3,"gpus":0})",
                          R"({"instance":"a","ip":"1","size":"3","gpus":0})", R"({"instance":"a","ip":"1","size":0,"gpus":0})",
                          R"({"instance":"a","ip":"1","size":3,"gpus":-1})", R"({"instance":"a","ip":"1","size":3.5,"gpus":0})",
                          R"({"instance":"a","ip":"1","size":99999999999999999999,"gpus":0})",
                          R"({"instance":7,"ip":"1","size":3,"gpus":0})", R"({"instance":"a","ip":"1","size":3})"}) {
    INFO(bad);
    CHECK(ParseMember(bad).status().code() == StatusCode::kInvalidArgument);
  }
  CHECK_FALSE(ParseMember(std::string(70000, ' ') + "{}").ok());
  CHECK_FALSE(ParseMember(std::string("{\"instance\":\"\xff\"}")).ok());
}

TEST_CASE("generation records round-trip and are checked", "[gang]") {
  Generation g{7, "2026-11-25T08:00:00.000Z", {{"a", "10.0.0.1", 0, 12}, {"b", "10.0.0.2", 1, 0}}, "0123456789abcdef"};
  auto back = ParseGeneration(GenerationJson(g));
  REQUIRE(back.ok());
  CHECK(*back == g);
  for (const char* bad : {
           R"({"generation":0,"members":[{"instance":"a","ip":"1","rank":0}]})",
           R"({"generation":"1","members":[{"instance":"a","ip":"1","rank":0}]})",
           R"({"generation":1,"members":[]})",
           R"({"generation":1})",
           R"({"generation":1,"members":{}})",
           R"({"generation":1,"members":[{"instance":"a","ip":"1","rank":1}]})",
           R"({"generation":1,"members":[{"instance":"a","ip":"1","rank":0},{"instance":"a","ip":"2","rank":1}]})",
           R"({"generation":1,"members":[{"instance":"a","ip":"1","rank":0},{"instance":"b","ip":"2","rank":0}]})",
           R"({"generation":1,"members":[7]})",
           R"({"generation":1,"members":[{"instance":"a","rank":0}]})",
           R"({"generation":1,"formed_at":5,"members":[{"instance":"a","ip":"1","rank":0}]})",
           R"({"generation":1,"members":[{"instance":"a","ip":"1","rank":0,"registered":"5"}]})",
           R"({"generation":1,"members":[{"instance":"a","ip":"1","rank":0,"registered":-5}]})",
           "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
       }) {
    INFO(bad);
    CHECK(ParseGeneration(bad).status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("end records round-trip and are checked", "[gang]") {
  auto e = ParseEnd(EndJson({"vm-a", "preempted", "2026-11-25T08:00:00Z"}));
  REQUIRE(e.ok());
  CHECK(e->by == "vm-a");
  CHECK(e->reason == "preempted");
  CHECK_FALSE(e->failed);
  CHECK(EndJson({"vm-a", "preempted", ""}).find("failed") == std::string::npos);  // older readers see what they knew
  auto f = ParseEnd(EndJson({"vm-b", "trainer failed (exit code 3)", "", true}));
  REQUIRE(f.ok());
  CHECK(f->failed);
  CHECK_FALSE(ParseEnd(R"({"reason":"x","failed":"yes"})").ok());
  CHECK_FALSE(ParseEnd(R"({"by":"a"})").ok());
  CHECK_FALSE(ParseEnd(R"({"reason":5})").ok());
  CHECK_FALSE(ParseEnd("garbage").ok());
  // Our own reason with invalid UTF-8 is written (replaced), never thrown on.
  auto odd = ParseEnd(EndJson({"vm-a", std::string("bad \xff byte", 10), ""}));
  REQUIRE(odd.ok());
  CHECK(odd->reason.find("bad") == 0);
}

TEST_CASE("the gang prefix", "[gang]") { CHECK(GangPrefix("train") == "/spotvisor/gang/train/"); }

// ---------------------------------------------------------------------------
// The coordinator over an in-memory etcd: no network, no real waits. A
// parked watch moves the fake clock to its deadline, as if nothing happened
// meanwhile.

class FakeClock final : public Clock {
 public:
  SteadyTime Now() const override { return now; }
  WallTime WallNow() const override { return std::chrono::system_clock::time_point{} + std::chrono::hours(490000); }
  SteadyTime now{};
};

class RecordingSleeper final : public Sleeper {
 public:
  bool SleepFor(std::chrono::milliseconds d) override {
    delays.push_back(d);
    return true;
  }
  std::vector<std::chrono::milliseconds> delays;
};

class FakeEtcd final : public EtcdClient {
 public:
  explicit FakeEtcd(FakeClock& clock) : clock_(clock) {}

  StatusOr<std::int64_t> LeaseGrant(std::chrono::seconds, const CallContext&) override {
    leases.insert(next_lease);
    return next_lease++;
  }
  StatusOr<std::chrono::seconds> LeaseKeepAlive(std::int64_t id, const CallContext&) override {
    if (!leases.count(id)) return NotFoundError("lease not found");
    return std::chrono::seconds(10);
  }
  StatusOr<std::chrono::seconds> LeaseTimeToLive(std::int64_t id, const CallContext& c) override { return LeaseKeepAlive(id, c); }
  Status LeaseRevoke(std::int64_t id, const CallContext&) override {
    if (!leases.erase(id)) return NotFoundError("lease not found");
    std::vector<std::string> doomed;
    for (const auto& [k, v] : kvs) {
      if (v.lease == id) doomed.push_back(k);
    }
    for (const auto& k : doomed) Del(k);
    return OkStatus();
  }
  StatusOr<std::int64_t> Put(const std::string& key, const std::string& value, std::int64_t lease, const CallContext&) override {
    if (lease && !leases.count(lease)) return NotFoundError("requested lease not found");
    return Set(key, value, lease);
  }
  StatusOr<std::pair<std::vector<EtcdKv>, std::int64_t>> Range(const std::string& key, const std::string& end,
                                                               const CallContext&) override {
    ++ranges;
    auto out = std::make_pair(In(key, end), rev);
    if (after_range) {
      auto fn = std::move(after_range);
      after_range = nullptr;
      fn();  // another member acts between this read and the caller's next
    }
    return out;
  }
  StatusOr<std::int64_t> Delete(const std::string& key, const std::string&, const CallContext&) override {
    return kvs.count(key) ? (Del(key), 1) : 0;
  }
  StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& cmp, const std::vector<EtcdOp>& success,
                              const std::vector<EtcdOp>& failure, const CallContext&) override {
    ++txns;
    bool ok = true;
    for (const auto& c : cmp) {
      auto it = kvs.find(c.key);
      std::int64_t v = 0;
      if (it != kvs.end()) v = c.target == EtcdCompare::kCreate ? it->second.create_revision : it->second.mod_revision;
      REQUIRE(c.result == EtcdCompare::kEqual);
      ok = ok && v == c.number;
    }
    EtcdTxnResult r;
    r.succeeded = ok;
    for (const auto& op : ok ? success : failure) {
      if (op.kind == EtcdOp::kPut) Set(op.key, op.value, op.lease);
      if (op.kind == EtcdOp::kRange) r.ranges.push_back(In(op.key, op.range_end));
    }
    r.revision = rev;
    if (lose_answers > 0) {
      --lose_answers;
      return UnavailableError("etcd txn at http://fake: outcome unknown (timeout)");
    }
    return r;
  }
  Status Watch(const std::string& key, const std::string& end, std::int64_t start,
               const std::function<void(const std::vector<EtcdEvent>&, std::int64_t)>& on_events,
               const CallContext& ctx) override {
    ++watches;
    std::vector<EtcdEvent> batch;
    for (const auto& e : history) {
      if (e.kv.mod_revision >= start && e.kv.key >= key && e.kv.key < end) batch.push_back(e);
    }
    if (!batch.empty()) on_events(batch, rev);
    if (ctx.cancelled()) return OkStatus();
    if (on_park) {
      auto fn = std::move(on_park);
      on_park = nullptr;
      fn();
      return Watch(key, end, start, on_events, ctx);
    }
    if (ctx.deadline) clock_.now = std::max(clock_.now, *ctx.deadline);
    return OkStatus();
  }

  std::int64_t Set(const std::string& key, const std::string& value, std::int64_t lease) {
    ++rev;
    auto& kv = kvs[key];
    if (kv.create_revision == 0) kv.create_revision = rev;
    kv.key = key;
    kv.value = value;
    kv.mod_revision = rev;
    ++kv.version;
    kv.lease = lease;
    history.push_back({EtcdEvent::kPut, kv});
    return rev;
  }
  void Del(const std::string& key) {
    ++rev;
    kvs.erase(key);
    EtcdKv gone;
    gone.key = key;
    gone.mod_revision = rev;
    history.push_back({EtcdEvent::kDelete, gone});
  }
  std::vector<EtcdKv> In(const std::string& key, const std::string& end) const {
    std::vector<EtcdKv> out;
    for (const auto& [k, v] : kvs) {
      if (end.empty() ? k == key : (k >= key && k < end)) out.push_back(v);
    }
    return out;
  }

  std::map<std::string, EtcdKv> kvs;
  std::vector<EtcdEvent> history;
  std::set<std::int64_t> leases;
  std::int64_t rev = 1, next_lease = 100;
  int lose_answers = 0;  // the next Txns are applied, but their answers lost
  int txns = 0, ranges = 0, watches = 0;
  std::function<void()> on_park;  // runs once, when a watch would park: "another member acts"
  std::function<void()> after_range;  // runs once, right after the next Range is answered

 private:
  FakeClock& clock_;
};

struct Harness {
  FakeClock clock;
  RecordingSleeper sleeper;
  FakeEtcd etcd{clock};
  const std::string prefix = GangPrefix("g");

  std::unique_ptr<GangCoordinator> Coordinator(const GangMember& m, int size = 2) {
    return std::make_unique<GangCoordinator>(etcd, GangOptions{"g", size, std::chrono::seconds(10)}, m, clock, sleeper);
  }
  CallContext Ctx(std::chrono::seconds d = std::chrono::seconds(600)) {
    CallContext c;
    c.clock = &clock;
    c.deadline = clock.now + d;
    return c;
  }
  // Another member, registered under a lease of its own.
  std::int64_t Register(const GangMember& m) {
    auto lease = etcd.LeaseGrant(std::chrono::seconds(10), Background());
    etcd.Set(prefix + "members/" + m.instance, MemberJson(m), *lease);
    return *lease;
  }
};

TEST_CASE("coordinator: Join recognises its own registration when the Txn's answer was lost", "[gang]") {
  Harness h;
  auto self = M("vm-a", "10.0.0.1", 2);
  auto c = h.Coordinator(self);
  h.etcd.lose_answers = 1;
  REQUIRE(c->Join(h.Ctx()).ok());
  REQUIRE(h.etcd.kvs.count(h.prefix + "members/vm-a"));
  CHECK(h.etcd.kvs[h.prefix + "members/vm-a"].version == 1);
  CHECK(h.etcd.leases.size() == 1);  // not refused as somebody else, no second lease
  CHECK(h.sleeper.delays.size() == 1);
  CHECK(c->KeepAlive(h.Ctx()).ok());
  // Joining again moves the key to a new lease and frees the old one.
  REQUIRE(c->Join(h.Ctx()).ok());
  CHECK(h.etcd.leases.size() == 1);
  CHECK(h.etcd.kvs[h.prefix + "members/vm-a"].version == 2);
  REQUIRE(c->Leave(h.Ctx()).ok());
  CHECK(h.etcd.kvs.empty());
  CHECK(c->KeepAlive(h.Ctx()).code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("coordinator: Join refuses what cannot be a key", "[gang]") {
  Harness h;
  CHECK(h.Coordinator(M("a/b", "10.0.0.1"))->Join(h.Ctx()).code() == StatusCode::kInvalidArgument);
  CHECK(h.Coordinator(M("a", ""))->Join(h.Ctx()).code() == StatusCode::kInvalidArgument);
  CHECK(h.Coordinator(M("a", "10.0.0.1"), 0)->Join(h.Ctx()).code() == StatusCode::kInvalidArgument);
  CHECK(h.etcd.leases.empty());
}

TEST_CASE("coordinator: Join refuses a name held by another boot, or by an unreadable record, and frees its lease", "[gang]") {
  Harness h;
  h.Register(M("vm-a", "10.0.0.9"));
  auto self = M("vm-a", "10.0.0.1");
  self.boot_id = "another-boot";
  auto c = h.Coordinator(self);
  Status s = c->Join(h.Ctx());
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  INFO(s.message());
  CHECK(s.message().find("\"boot-vm-a\"") != std::string::npos);
  CHECK(s.message().find("\"another-boot\"") != std::string::npos);
  CHECK(s.message().find("\"10.0.0.9\"") != std::string::npos);
  CHECK(h.etcd.leases.size() == 1);  // ours was revoked

  h.etcd.Set(h.prefix + "members/vm-z", "\xff garbage", 0);
  Status z = h.Coordinator(M("vm-z", "10.0.0.2"))->Join(h.Ctx());
  CHECK(z.code() == StatusCode::kFailedPrecondition);
  CHECK(z.message().find("unreadable") != std::string::npos);
}

TEST_CASE("coordinator: a lost commit answer is recognised, the generation adopted, not committed twice", "[gang]") {
  Harness h;
  h.Register(M("vm-b", "10.0.0.2", 2));
  auto c = h.Coordinator(M("vm-a", "10.0.0.1", 2));
  REQUIRE(c->Join(h.Ctx()).ok());
  h.etcd.lose_answers = 1;
  auto g = c->AwaitGeneration(h.Ctx());
  REQUIRE(g.ok());
  CHECK(g->number == 1);
  CHECK(Names(g->members) == Names_{"vm-a", "vm-b"});
  CHECK(h.etcd.kvs[h.prefix + "generation"].version == 1);
  auto stored = ParseGeneration(h.etcd.kvs[h.prefix + "generation"].value);
  REQUIRE(stored.ok());
  CHECK(*stored == *g);
}

TEST_CASE("coordinator: waits (watching) for the last member, then commits, and a standby keeps waiting", "[gang]") {
  Harness h;
  auto c = h.Coordinator(M("vm-a", "10.0.0.5", 2));
  CHECK(c->AwaitGeneration(h.Ctx()).status().code() == StatusCode::kNotFound);  // not joined
  REQUIRE(c->Join(h.Ctx()).ok());
  h.etcd.on_park = [&] { h.Register(M("vm-b", "10.0.0.2", 2)); };
  auto g = c->AwaitGeneration(h.Ctx());
  REQUIRE(g.ok());
  CHECK(Names(g->members) == Names_{"vm-b", "vm-a"});
  CHECK(h.sleeper.delays.empty());

  auto standby = h.Coordinator(M("vm-s", "10.0.0.1", 2));
  REQUIRE(standby->Join(h.Ctx()).ok());
  int ranges = h.etcd.ranges;
  auto r = standby->AwaitGeneration(h.Ctx(std::chrono::seconds(300)));
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(h.etcd.ranges == ranges + 1);  // read once, then watched: no polling
  CHECK(h.etcd.kvs[h.prefix + "generation"].version == 1);
}

TEST_CASE("coordinator: a member already gone ends the generation, recorded once, same reason for all", "[gang]") {
  Harness h;
  auto a = h.Coordinator(M("vm-a", "10.0.0.1", 2));
  REQUIRE(a->Join(h.Ctx()).ok());
  auto lease_b = h.Register(M("vm-b", "10.0.0.2", 2));
  auto g = a->AwaitGeneration(h.Ctx());
  REQUIRE(g.ok());
  REQUIRE(h.etcd.LeaseRevoke(lease_b, Background()).ok());
  auto why = a->AwaitEnd(*g, h.Ctx());
  REQUIRE(why.ok());
  CHECK(*why == "member vm-b is gone");
  auto rec = ParseEnd(h.etcd.kvs[h.prefix + "end/1"].value);
  REQUIRE(rec.ok());
  CHECK(rec->by == "vm-a");
  CHECK(a->AwaitEnd(*g, h.Ctx()).value() == "member vm-b is gone");

  // Gone and back before anyone looked: the key was created anew.
  auto g1b = [&] {
    h.etcd.Del(h.prefix + "end/1");
    return *g;
  }();
  CHECK(g1b.members[1].registered != 0);
  auto lease_b2 = h.Register(M("vm-b", "10.0.0.2", 2));
  CHECK(a->AwaitEnd(g1b, h.Ctx()).value() == "member vm-b was gone (it registered again)");
  REQUIRE(h.etcd.LeaseRevoke(lease_b2, Background()).ok());

  // The end record arrives while parked: taken from the event.
  h.Register(M("vm-b", "10.0.0.2", 2));
  auto g2 = a->AwaitGeneration(h.Ctx());
  REQUIRE(g2.ok());
  CHECK(g2->number == 2);
  CHECK(Names(g2->members) == Names_{"vm-a", "vm-b"});
  h.etcd.on_park = [&] { h.etcd.Set(h.prefix + "end/2", EndJson({"vm-b", "preempted", ""}), 0); };
  CHECK(a->AwaitEnd(*g2, h.Ctx()).value() == "preempted");
}

TEST_CASE("coordinator: gang-launch = leader: the key and the readiness are exchanged through etcd, watched not polled", "[gang]") {
  Harness h;
  auto a = h.Coordinator(M("vm-a", "10.0.0.1", 2));  // rank 0: the lower address
  REQUIRE(a->Join(h.Ctx()).ok());
  auto b = h.Coordinator(M("vm-b", "10.0.0.2", 2));
  REQUIRE(b->Join(h.Ctx()).ok());
  auto g = a->AwaitGeneration(h.Ctx());
  REQUIRE(g.ok());
  REQUIRE(g->members[0].instance == "vm-a");
  // vm-b waits for the key: it arrives while its watch is parked.
  h.etcd.on_park = [&] { REQUIRE(a->PublishSshKey(*g, "ssh-ed25519 AAAA k", h.Ctx()).ok()); };
  int ranges = h.etcd.ranges;
  auto key = b->AwaitSshKey(*g, h.Ctx());
  REQUIRE(key.ok());
  CHECK(*key == "ssh-ed25519 AAAA k");
  CHECK(h.etcd.ranges - ranges == 4);  // key and end read before the watch and after it: no polling
  // The key is leased by rank 0: it goes with rank 0.
  CHECK(h.etcd.kvs[h.prefix + "ssh/1/key"].lease != 0);
  // Rank 0 waits until every other member is ready.
  h.etcd.on_park = [&] { REQUIRE(b->MarkSshReady(*g, h.Ctx()).ok()); };
  CHECK(a->AwaitSshReady(*g, h.Ctx()).ok());
  CHECK(h.etcd.kvs.count(h.prefix + "ssh/1/ready/vm-b") == 1);
  // Not ready in time: the forming deadline says so.
  auto g2 = *g;
  g2.number = 7;
  CHECK(a->AwaitSshReady(g2, h.Ctx(std::chrono::seconds(30))).code() == StatusCode::kDeadlineExceeded);
  // The generation ends while waiting: said at once, not waited out.
  h.etcd.Set(h.prefix + "end/7", EndJson({"vm-a", "preempted", ""}), 0);
  auto gone = b->AwaitSshKey(g2, h.Ctx());
  CHECK(gone.status().code() == StatusCode::kFailedPrecondition);
  CHECK(gone.status().message().find("preempted") != std::string::npos);
}

TEST_CASE("coordinator: a member ready between rank 0's two reads is not missed (the watch starts at the first read)", "[gang]") {
  Harness h;
  auto a = h.Coordinator(M("vm-a", "10.0.0.1", 2));
  REQUIRE(a->Join(h.Ctx()).ok());
  auto b = h.Coordinator(M("vm-b", "10.0.0.2", 2));
  REQUIRE(b->Join(h.Ctx()).ok());
  auto g = a->AwaitGeneration(h.Ctx());
  REQUIRE(g.ok());
  // vm-b's readiness lands after rank 0 read the ready keys (none yet) and
  // before it read the end key: the revision rank 0 watches from must be
  // the first read's, or it waits for a change that never comes.
  h.etcd.after_range = [&] { REQUIRE(b->MarkSshReady(*g, h.Ctx()).ok()); };
  CHECK(a->AwaitSshReady(*g, h.Ctx(std::chrono::seconds(30))).ok());
}

TEST_CASE("coordinator: members' phases reach the others through the reads and watches they make anyway", "[gang]") {
  Harness h;
  auto a = h.Coordinator(M("vm-a", "10.0.0.1", 2));
  std::map<std::string, std::string> seen;
  a->SetPhaseHook([&](const std::string& instance, const std::string& phase) { seen[instance] = phase; });
  REQUIRE(a->Join(h.Ctx()).ok());
  auto b = h.Coordinator(M("vm-b", "10.0.0.2", 2));
  REQUIRE(b->Join(h.Ctx()).ok());
  REQUIRE(b->PublishPhase("forming", h.Ctx()).ok());
  auto g = a->AwaitGeneration(h.Ctx());  // reads the prefix: vm-b's phase comes with it
  REQUIRE(g.ok());
  CHECK(seen["vm-b"] == "forming");
  int ranges = h.etcd.ranges;
  // While a waits for the generation's end, b's changes arrive on the watch.
  h.etcd.on_park = [&] {
    REQUIRE(b->PublishPhase("running", h.Ctx()).ok());
    h.etcd.on_park = [&] { h.etcd.Set(h.prefix + "end/1", EndJson({"vm-b", "preempted", ""}), 0); };
  };
  CHECK(a->AwaitEnd(*g, h.Ctx()).value() == "preempted");
  CHECK(seen["vm-b"] == "running");
  CHECK(h.etcd.ranges - ranges == 1);  // one read, then only the watch
  // Leased: gone with the member. And a value that is not a phase is "?".
  h.etcd.Set(h.prefix + "phase/vm-x", "{\"phase\": 7}", 0);
  h.etcd.Set(h.prefix + "phase/vm-y", std::string(100, 'p'), 0);
  REQUIRE(b->Leave(h.Ctx()).ok());
  REQUIRE(a->AwaitGeneration(h.Ctx(std::chrono::seconds(5))).status().code() == StatusCode::kDeadlineExceeded);
  CHECK(seen["vm-x"] == "?");
  CHECK(seen["vm-y"] == "?");
  CHECK(h.etcd.kvs.count(h.prefix + "phase/vm-b") == 0);
}

TEST_CASE("coordinator: gang-launch = leader: rank 0 finishing completes the generation", "[gang]") {
  Harness h;
  GangOptions o{"g", 2, std::chrono::seconds(10)};
  o.leader_completes = true;
  GangCoordinator a(h.etcd, o, M("vm-a", "10.0.0.1", 2), h.clock, h.sleeper);
  GangCoordinator b(h.etcd, o, M("vm-b", "10.0.0.2", 2), h.clock, h.sleeper);
  REQUIRE(a.Join(h.Ctx()).ok());
  REQUIRE(b.Join(h.Ctx()).ok());
  auto g = a.AwaitGeneration(h.Ctx());
  REQUIRE(g.ok());
  CHECK(a.MarkDone(*g, h.Ctx()).value() == kGangCompleted);  // vm-b only hosted rank 0's processes
  // Without the option a host member's finishing is not enough, nor rank 0's alone.
  Harness h2;
  auto c = h2.Coordinator(M("vm-a", "10.0.0.1", 2));
  auto d = h2.Coordinator(M("vm-b", "10.0.0.2", 2));
  REQUIRE(c->Join(h2.Ctx()).ok());
  REQUIRE(d->Join(h2.Ctx()).ok());
  auto g2 = c->AwaitGeneration(h2.Ctx());
  REQUIRE(g2.ok());
  CHECK(c->MarkDone(*g2, h2.Ctx()).value() == "");
  CHECK(d->MarkDone(*g2, h2.Ctx()).value() == kGangCompleted);
}

TEST_CASE("coordinator: a spotvisor restarted on the same boot ends the generation it was in instead of joining it again",
          "[gang]") {
  Harness h;
  auto a = h.Coordinator(M("vm-a", "10.0.0.1", 2));
  auto b = h.Coordinator(M("vm-b", "10.0.0.2", 2));
  REQUIRE(a->Join(h.Ctx()).ok());
  REQUIRE(b->Join(h.Ctx()).ok());
  auto g = a->AwaitGeneration(h.Ctx());
  REQUIRE(g.ok());
  // vm-b's spotvisor restarts (the same boot id): it takes its key over.
  auto b2 = h.Coordinator(M("vm-b", "10.0.0.2", 2));
  REQUIRE(b2->Join(h.Ctx()).ok());
  auto why = a->AwaitEnd(*g, h.Ctx());
  REQUIRE(why.ok());
  CHECK(*why == "member vm-b registered again (its spotvisor restarted; its trainer of generation 1 is gone)");
  // The restarted one is not handed generation 1 back: the next one forms.
  REQUIRE(a->Join(h.Ctx()).ok());
  auto g2 = b2->AwaitGeneration(h.Ctx());
  REQUIRE(g2.ok());
  CHECK(g2->number == 2);
}

TEST_CASE("coordinator: the end record says whether the member that ended it failed; a member gone did not", "[gang]") {
  Harness h;
  auto a = h.Coordinator(M("vm-a", "10.0.0.1", 2));
  auto b = h.Coordinator(M("vm-b", "10.0.0.2", 2));
  REQUIRE(a->Join(h.Ctx()).ok());
  REQUIRE(b->Join(h.Ctx()).ok());
  auto g = a->AwaitGeneration(h.Ctx());
  REQUIRE(g.ok());
  REQUIRE(b->EndGeneration(g->number, "vm-b (rank 1): trainer failed (exit code 3)", h.Ctx(), true).ok());
  auto e = a->AwaitEndRecord(*g, h.Ctx());
  REQUIRE(e.ok());
  CHECK(e->failed);
  CHECK(e->by == "vm-b");
  // The next generation: vm-b's lease is revoked (gone), nobody failed.
  Harness h2;
  auto c = h2.Coordinator(M("vm-a", "10.0.0.1", 2));
  REQUIRE(c->Join(h2.Ctx()).ok());
  auto lease_b = h2.Register(M("vm-b", "10.0.0.2", 2));
  auto g2 = c->AwaitGeneration(h2.Ctx());
  REQUIRE(g2.ok());
  REQUIRE(h2.etcd.LeaseRevoke(lease_b, Background()).ok());
  auto gone = c->AwaitEndRecord(*g2, h2.Ctx());
  REQUIRE(gone.ok());
  CHECK(gone->reason == "member vm-b is gone");
  CHECK_FALSE(gone->failed);
}

TEST_CASE("coordinator: EndGeneration after a lost answer returns its own reason, a later one the first", "[gang]") {
  Harness h;
  auto a = h.Coordinator(M("vm-a", "10.0.0.1", 2));
  h.etcd.lose_answers = 1;
  CHECK(a->EndGeneration(4, "preempted", h.Ctx()).value() == "preempted");
  CHECK(a->EndGeneration(4, "maintenance", h.Ctx()).value() == "preempted");
  CHECK(h.etcd.kvs[h.prefix + "end/4"].version == 1);
  h.etcd.Set(h.prefix + "end/5", "{not json", 0);
  auto odd = a->EndGeneration(5, "x", h.Ctx());
  REQUIRE(odd.ok());
  CHECK(odd->find("unreadable") != std::string::npos);
}

TEST_CASE("coordinator: what other members wrote is checked: garbage is named, never trusted", "[gang]") {
  Harness h;
  auto a = h.Coordinator(M("vm-a", "10.0.0.1", 2));
  REQUIRE(a->Join(h.Ctx()).ok());
  h.Register(M("vm-b", "10.0.0.2", 2));
  SECTION("a member key that holds no member") {
    h.etcd.Set(h.prefix + "members/evil", "[1,2,3]", 0);
    auto r = a->AwaitGeneration(h.Ctx());
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK(r.status().message().find("members/evil") != std::string::npos);
  }
  SECTION("a member key whose record names another instance") {
    h.etcd.Set(h.prefix + "members/vm-c", MemberJson(M("vm-d", "10.0.0.4", 2)), 0);
    CHECK(a->AwaitGeneration(h.Ctx()).status().code() == StatusCode::kFailedPrecondition);
  }
  SECTION("an end record under another spelling of the number ends nothing") {
    h.etcd.Set(h.prefix + "end/01", EndJson({"x", "fake", ""}), 0);
    h.etcd.Set(h.prefix + "end/+1", EndJson({"x", "fake", ""}), 0);
    auto g = a->AwaitGeneration(h.Ctx());
    REQUIRE(g.ok());
    CHECK(g->number == 1);
    h.etcd.on_park = [&] { h.etcd.Set(h.prefix + "end/1", EndJson({"vm-b", "real", ""}), 0); };
    CHECK(a->AwaitEnd(*g, h.Ctx()).value() == "real");
  }
  SECTION("an unreadable generation record") {
    h.etcd.Set(h.prefix + "generation", R"({"generation":-1})", 0);
    auto r = a->AwaitGeneration(h.Ctx());
    CHECK(r.status().code() == StatusCode::kInternal);
    CHECK(r.status().message().find("delete it") != std::string::npos);
  }
  SECTION("members disagree on the size") {
    h.Register(M("vm-c", "10.0.0.3", 5));
    auto r = a->AwaitGeneration(h.Ctx());
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK(r.status().message().find("\"vm-c\" (\"10.0.0.3\") has 5") != std::string::npos);
    CHECK_FALSE(h.etcd.kvs.count(h.prefix + "generation"));
  }
}


}  // namespace
}  // namespace spotvisor
