#include "sync/checkpoint_set.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/random.h"
#include "common/strings.h"
#include "output/utf8.h"
#include "sync/manifest.h"

namespace spotvisor {
namespace {

using Json = nlohmann::json;

constexpr char kEmptyShare[] = "{\"version\":2,\"empty\":true}\n";

std::string RankDir(int rank) { return fmt::format("rank-{}/", rank); }

// The commit a manifest (or a share) names; "" for an empty share or text
// that is not a manifest.
struct ShareInfo {
  bool empty = false;
  std::string commit_id;
};
StatusOr<ShareInfo> ParseShare(const std::string& text, const std::string& what) {
  auto j = Json::parse(text, nullptr, false);
  if (!j.is_object()) return InternalError(what + " is not a JSON object");
  ShareInfo s;
  if (auto e = j.find("empty"); e != j.end() && e->is_boolean() && e->get<bool>()) {
    s.empty = true;
    return s;
  }
  auto c = j.find("commit_id");
  if (c == j.end() || !c->is_string()) return InternalError(what + " has no commit_id");
  s.commit_id = c->get<std::string>();
  return s;
}

// A share's name -> (K, the set); nullopt for anything else. Current names:
// "rank-K/sets/set-MINTED-gG-nN-ID.json"; an older version's:
// "rank-K/sets/gen-G.json".
std::optional<std::pair<int, SetId>> ParseShareName(const std::string& name) {
  if (!StartsWith(name, "rank-")) return std::nullopt;
  auto slash = name.find('/');
  if (slash == std::string::npos) return std::nullopt;
  auto rank = ParseUint64(name.substr(5, slash - 5));
  if (!rank || *rank > 1'000'000) return std::nullopt;
  std::string rest = name.substr(slash + 1);
  if (!StartsWith(rest, kSetsDir) || rest.size() < 5 || rest.compare(rest.size() - 5, 5, ".json") != 0) return std::nullopt;
  std::string base = rest.substr(std::string(kSetsDir).size(), rest.size() - std::string(kSetsDir).size() - 5);
  auto number = [](const std::string& t, std::int64_t max) -> std::optional<std::int64_t> {
    auto v = ParseUint64(t);
    if (!v || *v > static_cast<std::uint64_t>(max)) return std::nullopt;
    return static_cast<std::int64_t>(*v);
  };
  SetId set;
  if (StartsWith(base, "gen-")) {  // an older version's
    auto g = number(base.substr(4), INT64_MAX);
    if (!g || base.size() <= 4 + 5) return std::nullopt;
    set.generation = *g;
    return std::make_pair(static_cast<int>(*rank), set);
  }
  // set-MINTED-gG-nN-ID
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    auto dash = base.find('-', at);
    parts.push_back(base.substr(at, dash == std::string::npos ? std::string::npos : dash - at));
    if (dash == std::string::npos) break;
    at = dash + 1;
  }
  if (parts.size() != 5 || parts[0] != "set" || parts[2].size() < 2 || parts[2][0] != 'g' || parts[3].size() < 2 ||
      parts[3][0] != 'n' || parts[4].size() != 16 ||
      parts[4].find_first_not_of("0123456789abcdef") != std::string::npos) {
    return std::nullopt;
  }
  auto minted = number(parts[1], INT64_MAX);
  auto g = number(parts[2].substr(1), INT64_MAX);
  auto n = number(parts[3].substr(1), 100'000);
  if (!minted || !g || !n || *n < 1) return std::nullopt;
  set.minted_ns = *minted;
  set.generation = *g;
  set.size = static_cast<int>(*n);
  set.id = parts[4];
  return std::make_pair(static_cast<int>(*rank), set);
}

// Every share: the set -> the ranks holding one. One listing of each rank's
// sets/ (a few objects), not of "rank-", which holds every rank's checkpoint
// objects too: ranks 0..size-1, then on while a set seen is bigger.
StatusOr<std::vector<std::pair<SetId, std::set<int>>>> Shares(ObjectStore& run, int size, const CallContext& ctx) {
  std::vector<std::pair<SetId, std::set<int>>> sets;
  int upto = size;
  for (int k = 0; k < upto && k < 100'000; ++k) {
    auto listed = run.List(RankDir(k) + kSetsDir, ctx);
    if (!listed.ok()) return listed.status();
    for (auto const& o : *listed) {
      auto p = ParseShareName(o.name);
      if (!p || p->first != k) continue;
      upto = std::max(upto, p->second.size);
      auto it = std::find_if(sets.begin(), sets.end(), [&](auto const& e) { return e.first == p->second; });
      if (it == sets.end()) {
        sets.push_back({p->second, {}});
        it = std::prev(sets.end());
      }
      it->second.insert(k);
    }
  }
  return sets;
}

std::string RandomId() { return fmt::format("{:016x}", RandomSeed()); }

}  // namespace

void RankStore::SetRank(int rank) {
  std::lock_guard lk(mu_);
  rank_ = rank;
}

int RankStore::rank() const {
  std::lock_guard lk(mu_);
  return rank_;
}

StatusOr<std::string> RankStore::Name(const std::string& name) const {
  if (name == kDoneObject || name == kRunStatus) return name;  // the gang's
  int r = rank();
  if (r < 0) return FailedPreconditionError("gang-checkpoint = all: this member's rank is not known before the gang forms");
  return RankDir(r) + name;
}

StatusOr<ObjectInfo> RankStore::UploadFile(const std::string& name, const std::string& path, const Precondition& pre,
                                           const CallContext& ctx) {
  auto n = Name(name);
  if (!n.ok()) return n.status();
  auto r = run_->UploadFile(*n, path, pre, ctx);
  if (r.ok()) r->name = name;
  return r;
}

StatusOr<ObjectInfo> RankStore::UploadBytes(const std::string& name, const std::string& data, const Precondition& pre,
                                            const CallContext& ctx) {
  auto n = Name(name);
  if (!n.ok()) return n.status();
  auto r = run_->UploadBytes(*n, data, pre, ctx);
  if (r.ok()) r->name = name;
  return r;
}

StatusOr<std::string> RankStore::ReadBytes(const std::string& name, ObjectInfo* info, const CallContext& ctx) {
  auto n = Name(name);
  if (!n.ok()) return n.status();
  auto r = run_->ReadBytes(*n, info, ctx);
  if (r.ok() && info) info->name = name;
  return r;
}

StatusOr<ObjectInfo> RankStore::DownloadToFile(const std::string& name, const std::string& path, std::uint64_t size_hint,
                                               const CallContext& ctx) {
  auto n = Name(name);
  if (!n.ok()) return n.status();
  auto r = run_->DownloadToFile(*n, path, size_hint, ctx);
  if (r.ok()) r->name = name;
  return r;
}

StatusOr<std::vector<ObjectInfo>> RankStore::List(const std::string& prefix, const CallContext& ctx) {
  auto n = Name(prefix);
  if (!n.ok()) return n.status();
  auto r = run_->List(*n, ctx);
  if (!r.ok()) return r;
  // Names relative to this rank's directory, as the engine expects.
  auto dir = RankDir(rank());
  std::vector<ObjectInfo> out;
  out.reserve(r->size());
  for (auto& o : *r) {
    if (!StartsWith(o.name, dir)) continue;
    o.name = o.name.substr(dir.size());
    out.push_back(std::move(o));
  }
  return out;
}

Status RankStore::Delete(const std::string& name, const Precondition& pre, const CallContext& ctx) {
  auto n = Name(name);
  if (!n.ok()) return n.status();
  return run_->Delete(*n, pre, ctx);
}

std::string RankStore::Describe() const {
  int r = rank();
  return run_->Describe() + (r < 0 ? std::string("/rank-?") : fmt::format("/rank-{}", r));
}

std::string SetId::Describe() const {
  if (id.empty()) return fmt::format("generation {}'s set", generation);
  return fmt::format("generation {}'s set ({}, {} rank(s))", generation, id, size);
}

bool FormedAfter(const SetId& a, const SetId& b) {
  return std::tie(a.minted_ns, a.generation, a.id) > std::tie(b.minted_ns, b.generation, b.id);
}

std::string SetShareName(int rank, const SetId& set) {
  if (set.id.empty()) return fmt::format("{}{}gen-{:012}.json", RankDir(rank), kSetsDir, set.generation);
  return fmt::format("{}{}set-{:019}-g{:012}-n{}-{}.json", RankDir(rank), kSetsDir, set.minted_ns, set.generation,
                     set.size, set.id);
}

Status PrepareShare(ObjectStore& run, int rank, const SetId& set, const CallContext& ctx) {
  auto manifest = run.ReadBytes(RankDir(rank) + kManifestObject, nullptr, ctx);
  std::string text;
  if (manifest.ok()) {
    auto s = ParseShare(*manifest, run.Describe() + "/" + RankDir(rank) + kManifestObject);
    if (!s.ok()) return s.status();
    text = std::move(*manifest);
  } else if (manifest.status().code() == StatusCode::kNotFound) {
    text = kEmptyShare;  // this rank never committed: its share is "nothing"
  } else {
    return manifest.status();
  }
  // Rewriting a share with the same text (a retry) is harmless.
  auto up = run.UploadBytes(SetShareName(rank, set), text, {}, ctx);
  return up.ok() ? OkStatus() : up.status();
}

StatusOr<std::optional<SetId>> NewestCompleteSet(ObjectStore& run, int size, const CallContext& ctx) {
  if (size <= 0) return InvalidArgumentError("a gang set needs a size of at least 1");
  auto shares = Shares(run, size, ctx);
  if (!shares.ok()) return shares.status();
  std::optional<SetId> newest;
  for (auto const& [set, ranks] : *shares) {
    int n = set.size > 0 ? set.size : size;
    bool whole = true;
    for (int k = 0; k < n && whole; ++k) whole = ranks.count(k) > 0;
    if (whole && (!newest || FormedAfter(set, *newest))) newest = set;
  }
  return newest;
}

StatusOr<int> DropOlderShares(ObjectStore& run, int rank, const SetId& newest, const CallContext& ctx) {
  auto listed = run.List(RankDir(rank) + kSetsDir, ctx);
  if (!listed.ok()) return listed.status();
  int dropped = 0;
  for (auto const& o : *listed) {
    auto p = ParseShareName(o.name);
    if (!p || p->first != rank || !FormedAfter(newest, p->second)) continue;
    if (auto s = run.Delete(o.name, Precondition{o.generation}, ctx); !s.ok()) return s;
    ++dropped;
  }
  return dropped;
}

StatusOr<RollBack> RollBackToNewestSet(ObjectStore& run, int rank, int size, const CallContext& ctx) {
  RollBack out;
  auto newest = NewestCompleteSet(run, size, ctx);
  if (!newest.ok()) return newest.status();
  out.set = *newest;
  std::string manifest_name = RankDir(rank) + kManifestObject;
  ObjectInfo current_info;
  auto current = run.ReadBytes(manifest_name, &current_info, ctx);
  if (!current.ok() && current.status().code() != StatusCode::kNotFound) return current.status();
  std::optional<ShareInfo> current_share;
  if (current.ok()) {
    // A manifest that does not parse is replaced like any other: the set decides.
    if (auto s = ParseShare(*current, run.Describe() + "/" + manifest_name); s.ok()) current_share = *s;
  }
  Precondition pre{current.ok() ? current_info.generation : 0};
  std::optional<ShareInfo> want;
  std::string want_text;
  // A rank beyond the set's size (the gang grew) has no share of it: it
  // starts fresh, the others resume from the set.
  bool has_share = out.set && (out.set->size == 0 ? rank < size : rank < out.set->size);
  if (has_share) {
    auto text = run.ReadBytes(SetShareName(rank, *out.set), nullptr, ctx);
    if (!text.ok()) return text.status();
    auto s = ParseShare(*text, run.Describe() + "/" + SetShareName(rank, *out.set));
    if (!s.ok()) return s.status();
    want = *s;
    want_text = std::move(*text);
  }
  bool want_nothing = !want || want->empty;
  if (want_nothing) {
    if (current.ok()) {
      // Committed work is never deleted (issue #28): a copy of the manifest
      // stays in sets/, where the sync engine keeps what it names.
      if (current_share && !current_share->empty) {
        out.set_aside = fmt::format("{}{}aside-{:019}-{}.json", RankDir(rank), kSetsDir, current_info.generation, RandomId());
        auto up = run.UploadBytes(out.set_aside, *current, Precondition{0}, ctx);
        if (!up.ok()) return up.status();
      }
      if (auto s = run.Delete(manifest_name, pre, ctx); !s.ok()) return s;
      out.changed = true;
    }
  } else if (!current_share || current_share->empty || current_share->commit_id != want->commit_id) {
    auto up = run.UploadBytes(manifest_name, want_text, pre, ctx);
    if (!up.ok()) return up.status();
    out.changed = true;
  }
  if (out.set) {
    auto dropped = DropOlderShares(run, rank, *out.set, ctx);
    if (!dropped.ok()) return dropped.status();
    out.shares_dropped = *dropped;
  }
  return out;
}

}  // namespace spotvisor
