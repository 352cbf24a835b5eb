#include "gang/gang.h"

#include "common/random.h"

#include <arpa/inet.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "log/logger.h"
#include "retry/backoff_policy.h"
#include "retry/retry_policy.h"
#include "storage/transfer.h"

namespace spotvisor {

using json = nlohmann::json;

namespace {

// Bounds on what another member may make us hold or print.
constexpr std::size_t kMaxValue = 64 * 1024;
constexpr std::size_t kMaxField = 1024;
constexpr std::size_t kMaxMembers = 10000;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A quoted name for messages: whatever bytes it holds stay readable.
std::string Quoted(const std::string& s) { return Dump(json(s)); }

StatusOr<json> ParseObject(std::string_view text, const char* what) {
  if (text.size() > kMaxValue) return InvalidArgumentError(fmt::format("{} is {} bytes, more than {}", what, text.size(), kMaxValue));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgumentError(fmt::format("{} is not JSON", what));
  if (!j.is_object()) return InvalidArgumentError(fmt::format("{} is not a JSON object", what));
  return j;
}

Status Str(const json& obj, const char* name, bool required, std::string& out) {
  out.clear();
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) {
    return required ? InvalidArgumentError(fmt::format("\"{}\" is missing", name)) : OkStatus();
  }
  if (!it->is_string()) return InvalidArgumentError(fmt::format("\"{}\" is not a string", name));
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > kMaxField) return InvalidArgumentError(fmt::format("\"{}\" is longer than {} bytes", name, kMaxField));
  if (required && s.empty()) return InvalidArgumentError(fmt::format("\"{}\" is empty", name));
  out = s;
  return OkStatus();
}

// A JSON integer in [lo, hi]; a missing field is an error.
Status Int(const json& obj, const char* name, std::int64_t lo, std::int64_t hi, std::int64_t& out) {
  auto it = obj.find(name);
  if (it == obj.end()) return InvalidArgumentError(fmt::format("\"{}\" is missing", name));
  if (it->is_number_unsigned()) {
    auto u = it->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(hi)) return InvalidArgumentError(fmt::format("\"{}\" is out of range", name));
    out = static_cast<std::int64_t>(u);
  } else if (it->is_number_integer()) {
    out = it->get<std::int64_t>();
  } else {
    return InvalidArgumentError(fmt::format("\"{}\" is not an integer", name));
  }
  if (out < lo || out > hi) return InvalidArgumentError(fmt::format("\"{}\" is {}, outside [{}, {}]", name, out, lo, hi));
  return OkStatus();
}

Status First(std::initializer_list<Status> all) {
  for (const auto& s : all) {
    if (!s.ok()) return s;
  }
  return OkStatus();
}

// The rank order of members without a previous rank.
auto OrderKey(const GangMember& m) {
  in_addr a{};
  bool v4 = inet_pton(AF_INET, m.ip.c_str(), &a) == 1 && m.ip.find('\0') == std::string::npos;
  return std::make_tuple(!v4, v4 ? ntohl(a.s_addr) : 0u, v4 ? std::string() : m.ip, m.instance);
}

}  // namespace

std::vector<RankedMember> AssignRanks(const std::vector<GangMember>& live, int size,
                                      const std::optional<Generation>& previous) {
  if (size <= 0) return {};
  std::map<std::string, const GangMember*> by_name;
  for (const auto& m : live) by_name.emplace(m.instance, &m);  // a duplicate name: the first counts
  std::vector<std::optional<RankedMember>> slots(static_cast<std::size_t>(size));
  std::set<std::string> placed;
  if (previous) {
    for (const auto& p : previous->members) {
      auto it = by_name.find(p.instance);
      if (it == by_name.end() || p.rank < 0 || p.rank >= size || slots[p.rank] || placed.count(p.instance)) continue;
      slots[p.rank] = RankedMember{p.instance, it->second->ip, p.rank};
      placed.insert(p.instance);
    }
  }
  std::vector<const GangMember*> rest;
  for (const auto& [name, m] : by_name) {
    if (!placed.count(name)) rest.push_back(m);
  }
  std::sort(rest.begin(), rest.end(), [](const GangMember* a, const GangMember* b) { return OrderKey(*a) < OrderKey(*b); });
  auto next = rest.begin();
  for (int r = 0; r < size && next != rest.end(); ++r) {
    if (slots[r]) continue;
    slots[r] = RankedMember{(*next)->instance, (*next)->ip, r};
    ++next;
  }
  std::vector<RankedMember> out;
  for (auto& s : slots) {
    if (s) out.push_back(std::move(*s));
  }
  return out;
}

Status CheckAgreement(const std::string& gang, const GangMember& self, const std::vector<GangMember>& live) {
  auto who = [](const GangMember& m) { return fmt::format("{} ({})", Quoted(m.instance), Quoted(m.ip)); };
  for (const auto& m : live) {
    if (m.size != self.size) {
      return FailedPreconditionError(fmt::format(
          "gang {}: members disagree on gang-size: {} has {}, {} has {}; refusing to form until every member has "
          "the same gang-size",
          Quoted(gang), who(self), self.size, who(m), m.size));
    }
    if (m.command_hash != self.command_hash) {
      return FailedPreconditionError(fmt::format(
          "gang {}: members run different commands: {} has command hash {}, {} has {}; refusing to form until "
          "every member runs the same command",
          Quoted(gang), who(self), Quoted(self.command_hash), who(m), Quoted(m.command_hash)));
    }
    // Two runs under one gang name (project metadata sets spotvisor-gang,
    // each VM its own run-id) would train together and mix their work.
    struct Field {
      const char* key;
      const std::string& mine;
      const std::string& theirs;
    };
    for (const Field& f : {Field{"run-id", self.run_id, m.run_id}, Field{"bucket", self.bucket, m.bucket},
                           Field{"gang-checkpoint", self.checkpoint, m.checkpoint},
                           Field{"gang-launch", self.launch, m.launch}}) {
      if (f.mine.empty() || f.theirs.empty() || f.mine == f.theirs) continue;
      return FailedPreconditionError(fmt::format(
          "gang {}: members disagree on {}: {} has {}, {} has {}; refusing to form: one gang is one run (give each "
          "run its own gang name, or every member the same {})",
          Quoted(gang), f.key, who(self), Quoted(f.mine), who(m), Quoted(f.theirs), f.key));
    }
  }
  return OkStatus();
}

std::string MemberJson(const GangMember& m) {
  return Dump(json{{"instance", m.instance}, {"ip", m.ip}, {"zone", m.zone}, {"gpus", m.gpus}, {"size", m.size},
                   {"command_hash", m.command_hash}, {"boot_id", m.boot_id}, {"run_id", m.run_id}, {"bucket", m.bucket},
                   {"checkpoint", m.checkpoint}, {"launch", m.launch}});
}

StatusOr<GangMember> ParseMember(std::string_view text) {
  auto j = ParseObject(text, "a member record");
  if (!j.ok()) return j.status();
  GangMember m;
  std::int64_t gpus = 0, size = 0;
  Status s = First({Str(*j, "instance", true, m.instance), Str(*j, "ip", true, m.ip), Str(*j, "zone", false, m.zone),
                    Str(*j, "boot_id", false, m.boot_id), Str(*j, "command_hash", false, m.command_hash),
                    Str(*j, "run_id", false, m.run_id), Str(*j, "bucket", false, m.bucket),
                    Str(*j, "checkpoint", false, m.checkpoint), Str(*j, "launch", false, m.launch),
                    Int(*j, "gpus", 0, 1 << 16, gpus), Int(*j, "size", 1, 1 << 16, size)});
  if (!s.ok()) return InvalidArgumentError("a member record: " + s.message());
  m.gpus = static_cast<int>(gpus);
  m.size = static_cast<int>(size);
  return m;
}

std::string GenerationJson(const Generation& g) {
  json members = json::array();
  for (const auto& m : g.members) {
    members.push_back({{"instance", m.instance}, {"ip", m.ip}, {"rank", m.rank}, {"registered", m.registered}});
  }
  return Dump(json{{"generation", g.number}, {"formed_at", g.formed_at}, {"set_id", g.set_id}, {"members", members}});
}

StatusOr<Generation> ParseGeneration(std::string_view text) {
  auto j = ParseObject(text, "a generation record");
  if (!j.ok()) return j.status();
  auto bad = [](const std::string& why) { return InvalidArgumentError("a generation record: " + why); };
  Generation g;
  if (auto s = First({Int(*j, "generation", 1, std::numeric_limits<std::int64_t>::max(), g.number),
                      Str(*j, "formed_at", false, g.formed_at), Str(*j, "set_id", false, g.set_id)});
      !s.ok()) {
    return bad(s.message());
  }
  auto it = j->find("members");
  if (it == j->end() || !it->is_array()) return bad("\"members\" is not an array");
  if (it->empty() || it->size() > kMaxMembers) return bad(fmt::format("{} members", it->size()));
  std::set<std::string> seen;
  for (const auto& e : *it) {
    if (!e.is_object()) return bad("a member is not an object");
    RankedMember m;
    std::int64_t rank = 0;
    if (auto s = First({Str(e, "instance", true, m.instance), Str(e, "ip", true, m.ip),
                        Int(e, "rank", 0, static_cast<std::int64_t>(kMaxMembers), rank)});
        !s.ok()) {
      return bad("member " + std::to_string(g.members.size()) + ": " + s.message());
    }
    if (e.contains("registered")) {
      if (auto s = Int(e, "registered", 0, std::numeric_limits<std::int64_t>::max(), m.registered); !s.ok()) {
        return bad("member " + std::to_string(g.members.size()) + ": " + s.message());
      }
    }
    if (rank != static_cast<std::int64_t>(g.members.size())) {
      return bad(fmt::format("member {} has rank {}: members must be listed in rank order 0, 1, ...", Quoted(m.instance), rank));
    }
    if (!seen.insert(m.instance).second) return bad(fmt::format("{} is listed twice", Quoted(m.instance)));
    m.rank = static_cast<int>(rank);
    g.members.push_back(std::move(m));
  }
  return g;
}

std::string EndJson(const GenerationEnd& e) {
  json j{{"by", e.by}, {"reason", e.reason}, {"at", e.at}};
  if (e.failed) j["failed"] = true;
  return Dump(j);
}

StatusOr<GenerationEnd> ParseEnd(std::string_view text) {
  auto j = ParseObject(text, "an end record");
  if (!j.ok()) return j.status();
  GenerationEnd e;
  if (auto s = First({Str(*j, "by", false, e.by), Str(*j, "reason", true, e.reason), Str(*j, "at", false, e.at)}); !s.ok()) {
    return InvalidArgumentError("an end record: " + s.message());
  }
  if (auto f = j->find("failed"); f != j->end()) {
    if (!f->is_boolean()) return InvalidArgumentError("an end record: \"failed\" is not true or false");
    e.failed = f->get<bool>();
  }
  return e;
}

std::string GangPrefix(const std::string& name) { return "/spotvisor/gang/" + name + "/"; }

// ---------------------------------------------------------------------------

namespace {

// An end record, whatever it holds: an unreadable one still ends the
// generation, and is not taken for a member's failure.
GenerationEnd EndOf(std::int64_t n, std::string_view value) {
  auto e = ParseEnd(value);
  if (!e.ok()) return {"", fmt::format("generation {} ended (its end record is unreadable: {})", n, e.status().message()), "", false};
  return *e;
}

// The reason an end record gives, whatever it holds.
std::string ReasonOf(std::int64_t n, std::string_view value) { return EndOf(n, value).reason; }

GenerationEnd Unrecorded(std::string reason) { return {"", std::move(reason), "", false}; }

bool Contains(const Generation& g, const std::string& instance) {
  return std::any_of(g.members.begin(), g.members.end(), [&](const RankedMember& m) { return m.instance == instance; });
}

// Cancels `child` when `parent` is cancelled, for as long as it lives: a
// watch gets its own source so that it can also be stopped from its callback.
class CancelLink {
 public:
  CancelLink(const std::shared_ptr<CancelSource>& parent, std::shared_ptr<CancelSource> child) : parent_(parent) {
    if (parent_) id_ = parent_->Subscribe([child] { child->Cancel(); });
  }
  ~CancelLink() {
    if (parent_) parent_->Unsubscribe(id_);
  }
  CancelLink(const CancelLink&) = delete;
  CancelLink& operator=(const CancelLink&) = delete;

 private:
  std::shared_ptr<CancelSource> parent_;
  std::uint64_t id_ = 0;
};

}  // namespace

struct GangCoordinator::Snapshot {
  std::int64_t revision = 0;
  struct Live {
    GangMember member;
    std::int64_t mod_revision = 0, create_revision = 0;
  };
  std::map<std::string, Live> members;  // by instance
  std::vector<std::string> unreadable;  // member keys that hold no member: named in refusals
  std::optional<Generation> generation;
  std::int64_t generation_mod = 0;  // 0: no generation key
  Status generation_error;          // the key exists but is unreadable
  std::map<std::int64_t, std::string> ends;  // generation -> end record value

  bool Ended(std::int64_t n) const { return ends.count(n) > 0; }
  std::int64_t Highest() const {
    std::int64_t h = generation ? generation->number : 0;
    if (!ends.empty()) h = std::max(h, ends.rbegin()->first);
    return h;
  }
  // Why generation g is no longer in force, judged by its members; nullopt
  // while every member is live at the IP it was given.
  std::optional<std::string> Broken(const Generation& g) const {
    for (const auto& m : g.members) {
      auto it = members.find(m.instance);
      if (it == members.end()) return fmt::format("member {} is gone", m.instance);
      if (m.registered != 0 && it->second.create_revision != m.registered) {
        return fmt::format("member {} was gone (it registered again)", m.instance);
      }
      // Its record written again after the commit: a spotvisor restarted on
      // the same boot took its key over. It never adopts a trainer, so the
      // one it had in this generation is gone (issue #28: it joined the old
      // generation and started a fresh trainer beside the others' running ones).
      if (g.number == (generation ? generation->number : 0) && generation_mod != 0 &&
          it->second.mod_revision > generation_mod) {
        return fmt::format("member {} registered again (its spotvisor restarted; its trainer of generation {} is gone)",
                           m.instance, g.number);
      }
      if (it->second.member.ip != m.ip) {
        return fmt::format("member {} changed its IP from {} to {}", m.instance, m.ip, it->second.member.ip);
      }
    }
    return std::nullopt;
  }
};

GangCoordinator::GangCoordinator(EtcdClient& etcd, GangOptions options, GangMember self, const Clock& clock,
                                 Sleeper& sleeper)
    : etcd_(etcd),
      options_(std::move(options)),
      self_([&] {
        self.size = options_.size;
        return std::move(self);
      }()),
      prefix_(GangPrefix(options_.name)),
      clock_(clock),
      sleeper_(sleeper) {}

Status GangCoordinator::Backoff(const Status& why, int attempt, const CallContext& ctx) {
  if (IsPermanentFailure(why)) return why;
  // Short and capped: etcd is on the local network, and a cancel waits at
  // most one delay when the sleeper is not the context's.
  ExponentialBackoffPolicy backoff(std::chrono::milliseconds(100), std::chrono::milliseconds(1000), 2.0);
  std::chrono::milliseconds d{0};
  for (int i = 0; i <= std::min(attempt, 8); ++i) d = backoff.OnCompletion();
  ContextSleeper s(ctx, &sleeper_);
  if (!s.SleepFor(d)) {
    if (auto c = ctx.Check("gang " + options_.name); !c.ok()) return Status(c.code(), c.message() + " after: " + why.message());
    return why;
  }
  return OkStatus();
}

Status GangCoordinator::Join(const CallContext& ctx) {
  if (options_.name.empty() || options_.name.find('/') != std::string::npos || options_.size < 1 ||
      self_.instance.empty() || self_.instance.find('/') != std::string::npos || self_.ip.empty()) {
    return InvalidArgumentError(fmt::format("gang {}: cannot join as instance {} at {} in a gang of {}: the gang name "
                                            "and instance name must be non-empty without '/', the IP set, the size >= 1",
                                            Quoted(options_.name), Quoted(self_.instance), Quoted(self_.ip), options_.size));
  }
  const std::string key = MemberKey(self_.instance);
  auto lease = etcd_.LeaseGrant(options_.member_ttl, ctx);
  if (!lease.ok()) return lease.status();
  auto give_up = [&](Status s) {
    // Even when ctx has ended: the lease would otherwise hold the name for its TTL.
    CallContext c;
    c.clock = &clock_;
    c.deadline = clock_.Now() + std::chrono::seconds(2);
    (void)etcd_.LeaseRevoke(*lease, c);
    return s;
  };
  const std::string value = MemberJson(self_);
  for (int attempt = 0;; ++attempt) {
    if (attempt >= 10) return give_up(UnavailableError(fmt::format("gang {}: registering {} kept racing with other writes", options_.name, key)));
    // Repeating this Txn after a lost answer is safe: if the first attempt
    // landed, the failure branch reads back our own lease.
    auto txn = etcd_.Txn({{EtcdCompare::kCreate, EtcdCompare::kEqual, key, 0, ""}},
                         {{EtcdOp::kPut, key, value, "", *lease}}, {{EtcdOp::kRange, key, "", "", 0}}, ctx);
    if (!txn.ok()) {
      if (auto s = Backoff(txn.status(), attempt, ctx); !s.ok()) return give_up(s);
      continue;
    }
    if (txn->succeeded) break;
    if (txn->ranges.empty() || txn->ranges[0].empty()) continue;  // deleted meanwhile: try again
    const EtcdKv& held = txn->ranges[0][0];
    if (held.lease == *lease) break;
    auto other = ParseMember(held.value);
    if (!other.ok() || other->boot_id != self_.boot_id || self_.boot_id.empty()) {
      std::string them = other.ok() ? fmt::format("ip {}, zone {}, boot_id {}", Quoted(other->ip), Quoted(other->zone), Quoted(other->boot_id))
                                    : "an unreadable record: " + other.status().message();
      return give_up(FailedPreconditionError(fmt::format(
          "gang {}: instance name {} is already registered by another machine ({}); this machine is ip {}, boot_id "
          "{}. Two VMs with the same name cannot be in one gang: rename one, or wait for the other's lease ({} s) "
          "to expire if it is gone",
          Quoted(options_.name), Quoted(self_.instance), them, Quoted(self_.ip), Quoted(self_.boot_id),
          options_.member_ttl.count())));
    }
    // The same boot: a restarted spotvisor takes its own record over.
    auto take = etcd_.Txn({{EtcdCompare::kMod, EtcdCompare::kEqual, key, held.mod_revision, ""}},
                          {{EtcdOp::kPut, key, value, "", *lease}}, {}, ctx);
    if (take.ok() && take->succeeded) break;
    if (!take.ok()) {
      if (auto s = Backoff(take.status(), attempt, ctx); !s.ok()) return give_up(s);
    }
  }
  std::int64_t old = lease_.exchange(*lease);
  if (old != 0 && old != *lease) {
    // Joined before: the key has moved to the new lease, the old one holds nothing.
    (void)etcd_.LeaseRevoke(old, ctx);
  }
  return OkStatus();
}

Status GangCoordinator::KeepAlive(const CallContext& ctx) {
  std::int64_t lease = lease_;
  if (lease == 0) return FailedPreconditionError(fmt::format("gang {}: {} has not joined", options_.name, self_.instance));
  auto ttl = etcd_.LeaseKeepAlive(lease, ctx);
  if (ttl.ok()) return OkStatus();
  if (ttl.status().code() == StatusCode::kNotFound) {
    return NotFoundError(fmt::format("gang {}: the lease of member {} expired (no keep-alive for {} s?): its "
                                     "record is gone, and any generation with it has ended; Join again",
                                     options_.name, self_.instance, options_.member_ttl.count()));
  }
  return ttl.status();
}

Status GangCoordinator::Leave(const CallContext& ctx) {
  std::int64_t lease = lease_.exchange(0);
  if (lease == 0) return OkStatus();
  Status s = etcd_.LeaseRevoke(lease, ctx);
  if (s.ok() || s.code() == StatusCode::kNotFound) return OkStatus();
  std::int64_t none = 0;
  lease_.compare_exchange_strong(none, lease);  // still ours: Leave can be tried again
  return s;
}

StatusOr<GangCoordinator::Snapshot> GangCoordinator::Read(const CallContext& ctx) {
  auto r = etcd_.Range(prefix_, PrefixEnd(prefix_), ctx);
  if (!r.ok()) return r.status();
  Snapshot s;
  s.revision = r->second;
  for (const auto& kv : r->first) NotePhase(kv, false);
  const std::string members = prefix_ + "members/", ends = prefix_ + "end/", generation = prefix_ + "generation";
  for (const auto& kv : r->first) {
    if (kv.key.starts_with(members)) {
      std::string name = kv.key.substr(members.size());
      auto m = ParseMember(kv.value);
      if (!m.ok()) {
        s.unreadable.push_back(fmt::format("{} holds {}", Quoted(kv.key), m.status().message()));
      } else if (m->instance != name) {
        s.unreadable.push_back(fmt::format("{} holds instance {}", Quoted(kv.key), Quoted(m->instance)));
      } else {
        s.members[name] = Snapshot::Live{std::move(*m), kv.mod_revision, kv.create_revision};
      }
    } else if (kv.key.starts_with(ends)) {
      // Only the spelling EndKey writes: "end/05" must not end generation 5
      // for a reader while a watcher of "end/5" waits on.
      auto n = etcd_internal::ParseInt64(std::string_view(kv.key).substr(ends.size()));
      if (n && *n > 0 && kv.key == EndKey(*n)) s.ends[*n] = kv.value;
    } else if (kv.key == generation) {
      s.generation_mod = kv.mod_revision;
      auto g = ParseGeneration(kv.value);
      if (g.ok()) {
        s.generation = std::move(*g);
      } else {
        s.generation_error = InternalError(fmt::format("gang {}: {} is unreadable ({}); delete it to let the gang form again",
                                                       options_.name, Quoted(kv.key), g.status().message()));
      }
    }
  }
  return s;
}

StatusOr<bool> GangCoordinator::WatchOnce(std::int64_t revision,
                                          const std::function<bool(const std::vector<EtcdEvent>&)>& stop,
                                          const CallContext& ctx) {
  const Clock& clock = ctx.clock ? *ctx.clock : clock_;
  auto child = std::make_shared<CancelSource>();
  CancelLink link(ctx.cancel, child);
  CallContext w = ctx;
  w.clock = &clock;
  w = w.WithDeadline(clock.Now() + options_.watch_window);
  w.cancel = child;
  bool stopped = false;
  Status s = etcd_.Watch(prefix_, PrefixEnd(prefix_), revision + 1,
                         [&](const std::vector<EtcdEvent>& ev, std::int64_t) {
                           for (const auto& e : ev) NotePhase(e.kv, e.type == EtcdEvent::kDelete);
                           if (stopped || ev.empty() || !stop(ev)) return;
                           stopped = true;
                           child->Cancel();
                         },
                         w);
  if (stopped) return true;
  if (EtcdCompactRevision(s)) return true;  // history is gone: the caller reads afresh
  if (!s.ok()) return s;
  return false;
}

Status GangCoordinator::WaitForChange(std::int64_t revision, const CallContext& ctx) {
  // Members' phases are for status only: they wake nobody (they reach the
  // phase hook on the way).
  const std::string phases = prefix_ + "phase/";
  auto any = [&](const std::vector<EtcdEvent>& ev) {
    return std::any_of(ev.begin(), ev.end(), [&](const EtcdEvent& e) { return !e.kv.key.starts_with(phases); });
  };
  for (int attempt = 0;;) {
    if (auto c = ctx.Check("gang " + options_.name); !c.ok()) return c;
    auto w = WatchOnce(revision, any, ctx);
    if (w.ok() && *w) return OkStatus();
    if (w.ok()) continue;  // the window (or ctx) ended: checked above
    if (auto b = Backoff(w.status(), attempt++, ctx); !b.ok()) return b;
  }
}

StatusOr<std::optional<Generation>> GangCoordinator::TryCommit(const Snapshot& s, const std::vector<RankedMember>& chosen,
                                                               const CallContext& ctx) {
  const std::string key = prefix_ + "generation";
  Generation g{s.Highest() + 1, FormatRfc3339(clock_.WallNow()), chosen, fmt::format("{:016x}", RandomSeed())};
  for (auto& m : g.members) m.registered = s.members.at(m.instance).create_revision;
  std::vector<EtcdCompare> cmp;
  if (s.generation_mod == 0) {
    cmp.push_back({EtcdCompare::kCreate, EtcdCompare::kEqual, key, 0, ""});
  } else {
    cmp.push_back({EtcdCompare::kMod, EtcdCompare::kEqual, key, s.generation_mod, ""});
  }
  for (const auto& m : chosen) {
    cmp.push_back({EtcdCompare::kMod, EtcdCompare::kEqual, MemberKey(m.instance), s.members.at(m.instance).mod_revision, ""});
  }
  auto txn = etcd_.Txn(cmp, {{EtcdOp::kPut, key, GenerationJson(g), "", 0}}, {}, ctx);
  if (!txn.ok()) return txn.status();
  if (!txn->succeeded) return std::optional<Generation>();
  return std::optional<Generation>(std::move(g));
}

StatusOr<Generation> GangCoordinator::AwaitGeneration(const CallContext& ctx) {
  const std::string what = fmt::format("gang {}: waiting for a generation with {}", options_.name, self_.instance);
  for (int attempt = 0;;) {
    if (auto c = ctx.Check(what); !c.ok()) return c;
    auto snap = Read(ctx);
    if (!snap.ok()) {
      if (auto b = Backoff(snap.status(), attempt++, ctx); !b.ok()) return b;
      continue;
    }
    const Snapshot& s = *snap;
    auto me = s.members.find(self_.instance);
    if (me == s.members.end() || me->second.member.boot_id != self_.boot_id) {
      return NotFoundError(fmt::format("gang {}: {} is not registered (never joined, or its lease expired): Join again",
                                       options_.name, self_.instance));
    }
    if (!s.generation_error.ok()) return s.generation_error;
    if (s.generation && !s.Ended(s.generation->number)) {
      if (auto why = s.Broken(*s.generation)) {
        // Noticed before anyone wrote it down: record it, then re-read.
        if (auto e = EndGeneration(s.generation->number, *why, ctx); !e.ok()) {
          if (auto b = Backoff(e.status(), attempt++, ctx); !b.ok()) return b;
        }
        continue;
      }
      if (Contains(*s.generation, self_.instance)) return *s.generation;
      // In force without us: a standby waits for a gap.
    } else {
      if (!s.unreadable.empty()) {
        return FailedPreconditionError(fmt::format("gang {}: refusing to form: member key {}", options_.name, s.unreadable.front()));
      }
      std::vector<GangMember> live;
      for (const auto& [name, m] : s.members) live.push_back(m.member);
      if (auto a = CheckAgreement(options_.name, self_, live); !a.ok()) return a;
      auto chosen = AssignRanks(live, options_.size, s.generation);
      bool full = static_cast<int>(chosen.size()) == options_.size;
      bool in = std::any_of(chosen.begin(), chosen.end(), [&](const RankedMember& m) { return m.instance == self_.instance; });
      if (full && in) {
        auto won = TryCommit(s, chosen, ctx);
        if (!won.ok()) {
          // Outcome unknown or etcd away: the re-read shows whether it landed.
          if (auto b = Backoff(won.status(), attempt++, ctx); !b.ok()) return b;
          continue;
        }
        if (*won) return std::move(**won);
        continue;  // another member's commit won: adopt it
      }
    }
    if (auto w = WaitForChange(s.revision, ctx); !w.ok()) return w;
    attempt = 0;
  }
}

StatusOr<std::string> GangCoordinator::EndGeneration(std::int64_t n, const std::string& reason, const CallContext& ctx,
                                                     bool failed) {
  const std::string key = EndKey(n);
  const std::string value = EndJson({self_.instance, reason, FormatRfc3339(clock_.WallNow()), failed});
  for (int attempt = 0;; ++attempt) {
    if (auto c = ctx.Check(fmt::format("gang {}: ending generation {}", options_.name, n)); !c.ok()) return c;
    // Safe to repeat: when an earlier attempt landed, this one reads it back.
    auto txn = etcd_.Txn({{EtcdCompare::kCreate, EtcdCompare::kEqual, key, 0, ""}}, {{EtcdOp::kPut, key, value, "", 0}},
                         {{EtcdOp::kRange, key, "", "", 0}}, ctx);
    if (!txn.ok()) {
      if (auto b = Backoff(txn.status(), attempt, ctx); !b.ok()) return b;
      continue;
    }
    if (txn->succeeded) return reason;
    if (!txn->ranges.empty() && !txn->ranges[0].empty()) return ReasonOf(n, txn->ranges[0][0].value);
    if (attempt >= 10) return UnavailableError(fmt::format("gang {}: {} keeps vanishing", options_.name, key));
  }
}

StatusOr<std::string> GangCoordinator::MarkDone(const Generation& g, const CallContext& ctx) {
  const std::string dir = prefix_ + "done/" + std::to_string(g.number) + "/";
  const std::string end_key = EndKey(g.number);
  for (int attempt = 0;; ++attempt) {
    if (auto c = ctx.Check(fmt::format("gang {}: recording the end of generation {}'s work", options_.name, g.number)); !c.ok()) {
      return c;
    }
    // A Put of the same key and value: repeating it after a lost answer
    // changes nothing.
    auto put = etcd_.Put(dir + self_.instance, FormatRfc3339(clock_.WallNow()), 0, ctx);
    if (!put.ok()) {
      if (auto b = Backoff(put.status(), attempt, ctx); !b.ok()) return b;
      continue;
    }
    // Read after the put: of two members finishing at once, the later read
    // sees both, so the last one to finish always counts them all.
    auto done = etcd_.Range(dir, PrefixEnd(dir), ctx);
    auto end = done.ok() ? etcd_.Range(end_key, "", ctx) : StatusOr<std::pair<std::vector<EtcdKv>, std::int64_t>>(done.status());
    if (!end.ok()) {
      if (auto b = Backoff(end.status(), attempt, ctx); !b.ok()) return b;
      continue;
    }
    if (!end->first.empty()) return ReasonOf(g.number, end->first[0].value);
    std::set<std::string> finished;
    for (const auto& kv : done->first) finished.insert(kv.key.substr(dir.size()));
    bool all = options_.leader_completes
                   ? !g.members.empty() && finished.count(g.members.front().instance) > 0  // rank 0's command is the work
                   : std::all_of(g.members.begin(), g.members.end(),
                                 [&](const RankedMember& m) { return finished.count(m.instance) > 0; });
    if (!all) return std::string();
    return EndGeneration(g.number, kGangCompleted, ctx);
  }
}

Status GangCoordinator::PutLeased(const std::string& key, const std::string& value, const std::string& what,
                                  const CallContext& ctx) {
  for (int attempt = 0;; ++attempt) {
    if (auto c = ctx.Check(fmt::format("gang {}: {}", options_.name, what)); !c.ok()) return c;
    std::int64_t lease = lease_;
    if (lease == 0) return FailedPreconditionError(fmt::format("gang {}: {}: this member holds no lease", options_.name, what));
    auto put = etcd_.Put(key, value, lease, ctx);  // the same key and value again after a lost answer: no change
    if (put.ok()) return OkStatus();
    if (auto b = Backoff(put.status(), attempt, ctx); !b.ok()) return b;
  }
}

StatusOr<std::vector<EtcdKv>> GangCoordinator::AwaitKeys(std::int64_t n, const std::string& key, const std::string& range_end,
                                                         const std::function<bool(const std::vector<EtcdKv>&)>& enough,
                                                         const std::string& what, const CallContext& ctx) {
  const std::string end_key = EndKey(n);
  for (int attempt = 0;;) {
    if (auto c = ctx.Check(fmt::format("gang {}: {}", options_.name, what)); !c.ok()) return c;
    auto got = etcd_.Range(key, range_end, ctx);
    auto end = got.ok() ? etcd_.Range(end_key, "", ctx) : StatusOr<std::pair<std::vector<EtcdKv>, std::int64_t>>(got.status());
    if (!end.ok()) {
      if (auto b = Backoff(end.status(), attempt++, ctx); !b.ok()) return b;
      continue;
    }
    if (!end->first.empty()) {
      return FailedPreconditionError(fmt::format("gang {}: generation {} ended while {}: {}", options_.name, n, what,
                                                      ReasonOf(n, end->first[0].value)));
    }
    if (enough(got->first)) return got->first;
    // Nothing polled: the next change under the gang's prefix wakes us.
    // Watched from the first read's revision: a key written between the two
    // reads is after it (watching from the second read's would miss it, and
    // wait for the next unrelated change; seen as rank 0 never starting).
    if (auto w = WaitForChange(std::min(got->second, end->second), ctx); !w.ok()) return w;
  }
}

Status GangCoordinator::PublishPhase(const std::string& phase, const CallContext& ctx) {
  nlohmann::json j = {{"phase", phase}, {"time", FormatRfc3339(clock_.WallNow())}};
  return PutLeased(prefix_ + "phase/" + self_.instance, j.dump(), "publishing this member's phase", ctx);
}

void GangCoordinator::SetPhaseHook(std::function<void(const std::string&, const std::string&)> hook) {
  phase_hook_ = std::move(hook);
}

// A phase key of another member (written by PublishPhase): checked, never
// trusted; a value that is not one is shown as "?".
void GangCoordinator::NotePhase(const EtcdKv& kv, bool deleted) {
  const std::string dir = prefix_ + "phase/";
  if (!phase_hook_ || !kv.key.starts_with(dir)) return;
  std::string instance = kv.key.substr(dir.size());
  if (instance.empty() || instance.find('/') != std::string::npos) return;
  std::string phase;
  if (!deleted) {
    auto j = nlohmann::json::parse(kv.value, nullptr, false);
    auto p = j.is_object() ? j.find("phase") : j.end();
    phase = p != j.end() && p->is_string() && p->get_ref<const std::string&>().size() <= 64 ? p->get<std::string>() : "?";
  }
  phase_hook_(instance, phase);
}

Status GangCoordinator::PublishSshKey(const Generation& g, const std::string& key_line, const CallContext& ctx) {
  return PutLeased(SshKey(g.number), key_line, fmt::format("publishing generation {}'s ssh key", g.number), ctx);
}

StatusOr<std::string> GangCoordinator::AwaitSshKey(const Generation& g, const CallContext& ctx) {
  auto kvs = AwaitKeys(g.number, SshKey(g.number), "", [](const std::vector<EtcdKv>& k) { return !k.empty(); },
                       fmt::format("waiting for rank 0's ssh key of generation {}", g.number), ctx);
  if (!kvs.ok()) return kvs.status();
  return kvs->front().value;
}

Status GangCoordinator::MarkSshReady(const Generation& g, const CallContext& ctx) {
  return PutLeased(SshReadyDir(g.number) + self_.instance, "1",
                   fmt::format("saying generation {}'s ssh key is authorized", g.number), ctx);
}

Status GangCoordinator::AwaitSshReady(const Generation& g, const CallContext& ctx) {
  const std::string dir = SshReadyDir(g.number);
  auto enough = [&](const std::vector<EtcdKv>& kvs) {
    std::set<std::string> ready;
    for (const auto& kv : kvs) ready.insert(kv.key.substr(dir.size()));
    for (std::size_t i = 1; i < g.members.size(); ++i) {
      if (!ready.count(g.members[i].instance)) return false;
    }
    return true;
  };
  auto kvs = AwaitKeys(g.number, dir, PrefixEnd(dir), enough,
                       fmt::format("waiting for every member to authorize generation {}'s ssh key", g.number), ctx);
  return kvs.ok() ? OkStatus() : kvs.status();
}

StatusOr<GenerationEnd> GangCoordinator::AwaitEndRecord(const Generation& g, const CallContext& ctx) {
  const std::string end_key = EndKey(g.number), gen_key = prefix_ + "generation";
  std::set<std::string> member_keys;
  for (const auto& m : g.members) member_keys.insert(MemberKey(m.instance));
  for (int attempt = 0;;) {
    if (auto c = ctx.Check(fmt::format("gang {}: waiting for generation {} to end", options_.name, g.number)); !c.ok()) return c;
    auto snap = Read(ctx);
    if (!snap.ok()) {
      if (auto b = Backoff(snap.status(), attempt++, ctx); !b.ok()) return b;
      continue;
    }
    const Snapshot& s = *snap;
    if (auto it = s.ends.find(g.number); it != s.ends.end()) return EndOf(g.number, it->second);
    if (!s.generation || s.generation->number != g.number) {
      if (s.generation) return Unrecorded(fmt::format("generation {} was replaced by generation {}", g.number, s.generation->number));
      return Unrecorded(fmt::format("generation {}'s record is {}", g.number, s.generation_mod ? "unreadable" : "gone"));
    }
    if (auto why = s.Broken(g)) {
      auto e = EndGeneration(g.number, *why, ctx);
      if (!e.ok() && (ctx.cancelled() || ctx.expired())) return e.status();
      if (!e.ok() || *e == *why) return Unrecorded(*why);  // etcd cannot take the record now; it has ended all the same
      continue;  // another member's record won: read it whole
    }
    // In force: an end record is taken straight from the event (the fast
    // path every member waits on); anything else that touches the
    // generation is judged on a fresh read.
    std::optional<GenerationEnd> reason;
    auto stop = [&](const std::vector<EtcdEvent>& events) {
      for (const auto& e : events) {
        if (e.kv.key == end_key && e.type == EtcdEvent::kPut) {
          reason = EndOf(g.number, e.kv.value);
          return true;
        }
        if (e.kv.key == gen_key || member_keys.count(e.kv.key)) return true;
      }
      return false;
    };
    // A window that ends quietly is renewed from the same revision, without
    // reading again: an idle gang costs etcd one watch and the keep-alives.
    StatusOr<bool> w = false;
    do {
      w = WatchOnce(s.revision, stop, ctx);
    } while (!reason && w.ok() && !*w && !ctx.cancelled() && !ctx.expired());
    if (reason) return *reason;
    if (w.ok()) continue;  // stopped by an event (or history compacted), or ctx ended: read again
    if (auto b = Backoff(w.status(), attempt++, ctx); !b.ok()) return b;
  }
}

StatusOr<std::string> GangCoordinator::AwaitEnd(const Generation& g, const CallContext& ctx) {
  auto e = AwaitEndRecord(g, ctx);
  if (!e.ok()) return e.status();
  return e->reason;
}

}  // namespace spotvisor
