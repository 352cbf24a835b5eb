#include "sync/checkpoint_set.h"

#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

// "rank-K/sets/gen-G.json" -> (K, G).
std::optional<std::pair<int, std::int64_t>> ParseShareName(const std::string& name) {
  if (!StartsWith(name, "rank-")) return std::nullopt;
  auto slash = name.find('/');
  if (slash == std::string::npos) return std::nullopt;
  auto rank = ParseUint64(name.substr(5, slash - 5));
  std::string rest = name.substr(slash + 1);
  std::string head = std::string(kSetsDir) + "gen-";
  if (!rank || *rank > 1'000'000 || !StartsWith(rest, head) || rest.size() <= head.size() + 5 ||
      rest.compare(rest.size() - 5, 5, ".json") != 0) {
    return std::nullopt;
  }
  auto gen = ParseUint64(rest.substr(head.size(), rest.size() - head.size() - 5));
  if (!gen || *gen > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
  return std::make_pair(static_cast<int>(*rank), static_cast<std::int64_t>(*gen));
}

// Every share of ranks 0..size-1: generation -> ranks holding one. One
// listing of each rank's sets/ (a few objects), not of "rank-", which holds
// every rank's checkpoint objects too.
StatusOr<std::map<std::int64_t, std::set<int>>> Shares(ObjectStore& run, int size, const CallContext& ctx) {
  std::map<std::int64_t, std::set<int>> by_gen;
  for (int k = 0; k < size; ++k) {
    auto listed = run.List(RankDir(k) + kSetsDir, ctx);
    if (!listed.ok()) return listed.status();
    for (auto const& o : *listed) {
      if (auto p = ParseShareName(o.name); p && p->first == k) by_gen[p->second].insert(k);
    }
  }
  return by_gen;
}

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

std::string SetShareName(int rank, std::int64_t generation) {
  return fmt::format("{}{}gen-{:012}.json", RankDir(rank), kSetsDir, generation);
}

Status PrepareShare(ObjectStore& run, int rank, std::int64_t generation, const CallContext& ctx) {
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
  auto up = run.UploadBytes(SetShareName(rank, generation), text, {}, ctx);
  return up.ok() ? OkStatus() : up.status();
}

StatusOr<std::optional<std::int64_t>> NewestCompleteSet(ObjectStore& run, int size, const CallContext& ctx) {
  if (size <= 0) return InvalidArgumentError("a gang set needs a size of at least 1");
  auto shares = Shares(run, size, ctx);
  if (!shares.ok()) return shares.status();
  for (auto it = shares->rbegin(); it != shares->rend(); ++it) {
    if (it->second.size() == static_cast<std::size_t>(size)) return std::optional<std::int64_t>(it->first);
  }
  return std::optional<std::int64_t>();
}

StatusOr<int> DropOlderShares(ObjectStore& run, int rank, std::int64_t generation, const CallContext& ctx) {
  auto listed = run.List(RankDir(rank) + kSetsDir, ctx);
  if (!listed.ok()) return listed.status();
  int dropped = 0;
  for (auto const& o : *listed) {
    auto p = ParseShareName(o.name);
    if (!p || p->first != rank || p->second >= generation) continue;
    if (auto s = run.Delete(o.name, Precondition{o.generation}, ctx); !s.ok()) return s;
    ++dropped;
  }
  return dropped;
}

StatusOr<RollBack> RollBackToNewestSet(ObjectStore& run, int rank, int size, const CallContext& ctx) {
  RollBack out;
  auto newest = NewestCompleteSet(run, size, ctx);
  if (!newest.ok()) return newest.status();
  out.generation = *newest;
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
  if (out.generation) {
    auto text = run.ReadBytes(SetShareName(rank, *out.generation), nullptr, ctx);
    if (!text.ok()) return text.status();
    auto s = ParseShare(*text, run.Describe() + "/" + SetShareName(rank, *out.generation));
    if (!s.ok()) return s.status();
    want = *s;
    want_text = std::move(*text);
  }
  bool want_nothing = !want || want->empty;
  if (want_nothing) {
    if (current.ok()) {
      if (auto s = run.Delete(manifest_name, pre, ctx); !s.ok()) return s;
      out.changed = true;
    }
  } else if (!current_share || current_share->empty || current_share->commit_id != want->commit_id) {
    auto up = run.UploadBytes(manifest_name, want_text, pre, ctx);
    if (!up.ok()) return up.status();
    out.changed = true;
  }
  if (out.generation) {
    auto dropped = DropOlderShares(run, rank, *out.generation, ctx);
    if (!dropped.ok()) return dropped.status();
    out.shares_dropped = *dropped;
  }
  return out;
}

}  // namespace spotvisor
