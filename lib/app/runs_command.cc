#include "app/runs_command.h"

#include "app/group_state.h"
#include "app/laptop_credentials.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/duration.h"
#include "common/strings.h"
#include "log/logger.h"
#include "output/utf8.h"
#include "run/boots.h"
#include "run/budget.h"
#include "run/claim.h"
#include "retry/backoff_policy.h"
#include "retry/retry_policy.h"
#include "storage/file_object_store.h"
#include "storage/gcs_object_store.h"
#include "storage/s3_object_store.h"
#include "storage/user_credentials.h"
#include "supervisor/durability.h"
#include "sync/manifest.h"
#include "sync/sync_engine.h"

namespace spotvisor {
namespace {

// "2026-11-28T12:00:00.123456789Z" as "2026-11-28T12:00:00Z": a table a
// person reads needs no nanoseconds (--json keeps them).
std::string ToSeconds(const std::string& t) {
  auto dot = t.find('.');
  if (dot == std::string::npos || t.find('T') > dot || t.empty() || t.back() != 'Z') return t;
  return t.substr(0, dot) + "Z";
}

using Json = nlohmann::json;
constexpr int kExitUsage = 64;

const SystemClock& TheClock() {
  static const SystemClock clock;
  return clock;
}

std::string Shown(const std::string& s) { return output::EscapeInvalidUtf8(s); }

StatusOr<std::unique_ptr<TokenProvider>> Credentials(const RemoteOptions& o, bool auth) {
  if (!auth) return MakeNoAuthTokenProvider();
  return LaptopGoogleCredentials(o.access_token_command);
}

// A read-only view of URL (gs://BUCKET/PREFIX, s3://BUCKET/PREFIX or file:///PATH), rooted at its prefix.
StatusOr<std::unique_ptr<ObjectStore>> OpenStore(const std::string& url, const RemoteOptions& o);

// OpenStore for `command`: a bad URL is a usage error (64), missing
// credentials a failure (1); either is said on stderr. Null with `rc` set.
std::unique_ptr<ObjectStore> OpenFor(const char* command, const std::string& url, const RemoteOptions& o, int& rc) {
  if (auto loc = ParseStoreLocation(url); !loc.ok()) {
    std::fprintf(stderr, "spotvisor %s: %s\n", command, loc.status().message().c_str());
    rc = kExitUsage;
    return nullptr;
  }
  auto store = OpenStore(url, o);
  if (!store.ok()) {
    std::fprintf(stderr, "spotvisor %s: %s\n", command, store.status().message().c_str());
    rc = 1;
    return nullptr;
  }
  return std::move(*store);
}

StatusOr<std::unique_ptr<ObjectStore>> OpenStore(const std::string& url, const RemoteOptions& o) {
  auto loc = ParseStoreLocation(url);
  if (!loc.ok()) return loc.status();
  if (loc->scheme == "file") return MakeFileObjectStore(loc->prefix);
  if (loc->scheme == "s3") {
    S3Options s;
    s.bucket = loc->bucket;
    s.prefix = loc->prefix;
    s.streams = o.parallelism;
    s.clock = &TheClock();
    s.make_retry = [] { return std::make_unique<LimitedTimeRetryPolicy>(std::chrono::minutes(2), TheClock()); };
    s.make_backoff = [] {
      return std::make_unique<ExponentialBackoffPolicy>(std::chrono::milliseconds(500), std::chrono::seconds(32), 2.0);
    };
    auto creds = DefaultAwsCredentials(TheClock());
    if (!creds.ok()) return creds.status();
    return MakeS3ObjectStore(std::move(s), std::move(*creds));
  }
  GcsOptions g;
  bool auth = true;
  g.endpoint = StorageEndpoint(o.storage_endpoint, auth);
  while (!g.endpoint.empty() && g.endpoint.back() == '/') g.endpoint.pop_back();
  g.bucket = loc->bucket;
  g.prefix = loc->prefix;
  g.streams = o.parallelism;  // pull: files, and the ranges of large ones, at once
  g.make_retry = [] { return std::make_unique<LimitedTimeRetryPolicy>(std::chrono::minutes(2), TheClock()); };
  g.make_backoff = [] {
    return std::make_unique<ExponentialBackoffPolicy>(std::chrono::milliseconds(500), std::chrono::seconds(32), 2.0);
  };
  auto tokens = Credentials(o, auth);
  if (!tokens.ok()) return tokens.status();
  return MakeGcsObjectStore(std::move(g), std::move(*tokens));
}

struct RunRow {
  std::string run_id;
  std::string state = "unknown";  // done | running | an end reason | unknown
  std::optional<int> exit_code;
  std::int64_t sequence = 0;
  std::string committed_at, instance, since;
  int files = 0;
  std::uint64_t checkpoint_bytes = 0;  // the newest commit's files: what `pull` brings back
  std::uint64_t objects_bytes = 0;
  int objects = 0;
  std::vector<ObjectInfo> object_list;  // every object under RUN_ID/
  std::string problem;  // a file of the run that could not be read
  RunClaims claims;     // who holds the run (run/claim.h)
  RunBoots boots;       // its history (run/boots.h)
};

std::optional<Json> ReadJson(ObjectStore& store, const std::string& name, std::string& problem) {
  auto text = store.ReadBytes(name, nullptr, Background());
  if (!text.ok()) {
    if (text.status().code() != StatusCode::kNotFound) problem = text.status().message();
    return std::nullopt;
  }
  auto j = Json::parse(*text, nullptr, false);
  if (!j.is_object()) {
    problem = name + " is not a JSON object";
    return std::nullopt;
  }
  return j;
}

std::string Str(const Json& j, const char* k) {
  auto it = j.find(k);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}
std::optional<int> Int(const Json& j, const char* k) {
  auto it = j.find(k);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  auto v = it->get<long long>();
  if (v < INT32_MIN || v > INT32_MAX) return std::nullopt;
  return static_cast<int>(v);
}

// What a run's boots add up to: `spotvisor runs`' columns. Work lost: what
// preempted boots had not committed when they ended.
struct History {
  int preempted = 0, failed = 0, open = 0;
  double vm_seconds = 0;
  std::uint64_t lost_bytes = 0;
  std::string group, group_zone;  // the newest boot's
};
History Summarize(const RunBoots& boots) {
  History h;
  for (auto const& b : boots.boots) {
    h.preempted += b.reason == "preempted";
    h.failed += JudgeBoot(b) == BootVerdict::kFailure;
    h.open += !b.ended_at.has_value();
    if (b.vm_seconds) h.vm_seconds += *b.vm_seconds;
    if (b.reason == "preempted" && b.uncommitted_bytes) h.lost_bytes += *b.uncommitted_bytes;
    if (!b.group.empty()) {
      h.group = b.group;
      h.group_zone = b.zone;
    }
  }
  return h;
}
// projects/P/zones/Z/instanceGroupManagers/NAME -> NAME (Z); an ASG's name as it is.
std::string GroupName(const std::string& path) {
  auto parts = SplitOn(path, '/');
  if (parts.size() == 6 && parts[4] == "instanceGroupManagers") return fmt::format("{} ({})", parts[5], parts[3]);
  return path;
}

// Every run under the store's root: a first-level directory holding a
// manifest, DONE or status.json (anything else there is not a run).
// `deeper`: prefixes one level down that hold runs (PREFIX/X/RUN_ID/...),
// with how many, for a listing that found none at its own level.
bool IsRunObject(const std::string& rest) {
  return rest == kManifestObject || rest == kDoneObject || rest == kFailedObject || rest == kRunStatus ||
         rest.rfind(kClaimsDir, 0) == 0 ||
         rest.rfind(kBootsDir, 0) == 0;
}

StatusOr<std::vector<RunRow>> CollectRuns(ObjectStore& store, const std::string& url,
                                          std::map<std::string, std::set<std::string>>* deeper = nullptr) {
  auto listed = store.List("", Background());
  if (!listed.ok()) return Status(listed.status().code(), "listing " + url + ": " + listed.status().message());
  std::map<std::string, RunRow> runs;
  std::map<std::string, bool> is_run;
  for (auto const& obj : *listed) {
    auto slash = obj.name.find('/');
    if (slash == std::string::npos || slash == 0) continue;
    auto id = obj.name.substr(0, slash);
    auto rest = obj.name.substr(slash + 1);
    if (deeper) {
      auto second = rest.find('/');
      if (second != std::string::npos && second > 0 && IsRunObject(rest.substr(second + 1))) {
        (*deeper)[id].insert(rest.substr(0, second));
      }
    }
    auto& r = runs[id];
    r.run_id = id;
    r.objects += 1;
    r.objects_bytes += obj.size;
    r.object_list.push_back(obj);
    if (IsRunObject(rest)) is_run[id] = true;
  }
  std::vector<RunRow> rows;
  for (auto& [id, r] : runs) {
    if (!is_run[id]) continue;  // something else under the prefix
    auto& s = store;
    if (auto m = s.ReadBytes(id + "/" + kManifestObject, nullptr, Background()); m.ok()) {
      auto parsed = ParseManifest(*m, url + "/" + id + "/" + kManifestObject, "/nonexistent/spotvisor-runs");
      if (parsed.ok()) {
        r.sequence = parsed->sequence;
        r.committed_at = parsed->committed_at;
        r.instance = parsed->instance;
        r.files = static_cast<int>(parsed->files.size());
        for (auto const& f : parsed->files) r.checkpoint_bytes += f.size;
      } else {
        r.problem = parsed.status().message();
      }
    } else if (m.status().code() != StatusCode::kNotFound) {
      r.problem = m.status().message();
    }
    if (auto st = ReadJson(s, id + "/" + kRunStatus, r.problem)) {
      auto state = Str(*st, "state");
      r.state = state == "running" ? "running" : state == "ended" && !Str(*st, "reason").empty() ? Str(*st, "reason") : "unknown";
      r.exit_code = Int(*st, "exit_code");
      r.since = Str(*st, "time");
      if (r.instance.empty()) r.instance = Str(*st, "instance");
    }
    if (auto done = ReadJson(s, id + "/" + kDoneObject, r.problem)) {
      r.state = "done";
      r.exit_code = Int(*done, "exit_code");
    } else if (ReadJson(s, id + "/" + kFailedObject, r.problem)) {
      r.state = "run-failed";  // max-failed-boots used up (run/budget.h): no boot trains it again
    }
    // A VM holds a live claim: the run is running, whatever status.json says
    // (only rank 0 of a gang writes it, and only after its restore).
    r.claims = ReadClaims(s, id, r.object_list, Background());
    r.boots = ReadBoots(s, id, r.object_list, Background());
    if (!r.boots.problems.empty() && r.problem.empty()) r.problem = r.boots.problems.front();
    if (r.state != "done" && r.claims.AnyLive(TheClock().WallNow())) r.state = "running";
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

int ListRuns(const std::string& url, const RemoteOptions& o, bool json) {
  int rc = 0;
  auto store = OpenFor("runs", url, o, rc);
  if (!store) return rc;
  if (StartsWith(url, "file://")) {
    struct stat st {};
    auto dir = url.substr(7);
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      std::fprintf(stderr, "spotvisor runs: %s: no such directory\n", Shown(url).c_str());
      return 1;
    }
  }
  std::map<std::string, std::set<std::string>> deeper;
  auto collected = CollectRuns(*store, url, &deeper);
  if (!collected.ok()) {
    std::fprintf(stderr, "spotvisor runs: %s\n", collected.status().message().c_str());
    return 1;
  }
  auto& rows = *collected;
  // Each run's group, asked once; a failure is said once, after the table.
  GroupStates states(o);
  std::map<std::string, const GroupLookup*> groups;  // by run id
  std::vector<std::string> group_errors;
  if (o.group_state) {
    for (auto const& r : rows) {
      auto h = Summarize(r.boots);
      if (h.group.empty()) continue;
      auto const& g = states.Get(h.group, h.group_zone);
      if (!g.error.empty() && std::find(group_errors.begin(), group_errors.end(), g.error) == group_errors.end()) {
        group_errors.push_back(g.error);
      }
      groups[r.run_id] = &g;
    }
  }
  auto group_json = [&](const std::string& run_id) -> Json {
    auto it = groups.find(run_id);
    if (it == groups.end()) return nullptr;
    if (!it->second->state) return {{"error", it->second->error}};
    if (it->second->state->gone) return {{"gone", true}};
    return {{"target_size", it->second->state->target}, {"instances", it->second->state->instances}};
  };
  auto say_group_errors = [&] {
    for (auto const& e : group_errors) std::fprintf(stderr, "spotvisor runs: GROUP_NOW ?: %s\n", Shown(e).c_str());
  };
  if (json) {
    Json out = Json::array();
    for (auto const& r : rows) {
      Json j = {{"run_id", r.run_id}, {"state", r.state}, {"sequence", r.sequence}, {"files", r.files},
                {"checkpoint_bytes", r.checkpoint_bytes}, {"bytes", r.objects_bytes}, {"objects", r.objects}};
      j["committed_at"] = r.committed_at.empty() ? Json(nullptr) : Json(r.committed_at);
      j["instance"] = r.instance.empty() ? Json(nullptr) : Json(r.instance);
      j["exit_code"] = r.exit_code ? Json(*r.exit_code) : Json(nullptr);
      if (!r.since.empty()) j["status_time"] = r.since;
      if (!r.problem.empty()) j["problem"] = r.problem;
      // The run's history: each boot, and what they add up to.
      Json boots = Json::array();
      auto h = Summarize(r.boots);
      for (auto const& b : r.boots.boots) {
        boots.push_back({{"instance", b.instance},
                         {"zone", b.zone},
                         {"group", b.group.empty() ? Json(nullptr) : Json(b.group)},
                         {"started_at", FormatRfc3339(b.started_at)},
                         {"ended_at", b.ended_at ? Json(FormatRfc3339(*b.ended_at)) : Json(nullptr)},
                         {"reason", b.reason.empty() ? Json(nullptr) : Json(b.reason)},
                         {"exit_code", b.exit_code ? Json(*b.exit_code) : Json(nullptr)},
                         {"vm_seconds", b.vm_seconds ? Json(*b.vm_seconds) : Json(nullptr)},
                         {"uncommitted_bytes", b.uncommitted_bytes ? Json(*b.uncommitted_bytes) : Json(nullptr)}});
      }
      j["boots"] = boots;
      j["boot_summary"] = {{"boots", r.boots.boots.size()}, {"preempted", h.preempted}, {"failed", h.failed},
                           {"not_ended", h.open}, {"vm_seconds", h.vm_seconds}, {"lost_bytes", h.lost_bytes},
                           {"group", h.group.empty() ? Json(nullptr) : Json(h.group)},
                           {"group_state", group_json(r.run_id)}};
      out.push_back(std::move(j));
    }
    std::puts(out.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
    say_group_errors();
    return 0;
  }
  if (rows.empty()) {
    std::printf("no runs under %s\n", Shown(url).c_str());
    // gs://bucket given for gs://bucket/PREFIX: say where the runs are.
    for (auto const& [sub, ids] : deeper) {
      std::printf("  %zu run(s) one level down: spotvisor runs %s/%s\n", ids.size(), Shown(url).c_str(), Shown(sub).c_str());
    }
    return 0;
  }
  std::vector<std::vector<std::string>> table = {
      {"RUN_ID", "STATE", "EXIT", "COMMIT", "COMMITTED_AT", "CHECKPOINT", "INSTANCE", "BOOTS", "PREEMPTED", "VM_HOURS",
       "LOST", "GROUP", "GROUP_NOW"}};
  for (auto const& r : rows) {
    auto h = Summarize(r.boots);
    bool any = !r.boots.boots.empty();
    table.push_back({Shown(r.run_id), r.state, r.exit_code ? std::to_string(*r.exit_code) : "-",
                     r.sequence > 0 ? fmt::format("#{}", r.sequence) : "-",
                     r.committed_at.empty() ? "-" : Shown(ToSeconds(r.committed_at)),
                     r.sequence > 0 ? FormatBytes(r.checkpoint_bytes) : "-", r.instance.empty() ? "-" : Shown(r.instance),
                     any ? std::to_string(r.boots.boots.size()) : "-", any ? std::to_string(h.preempted) : "-",
                     any ? fmt::format("{:.2f}", h.vm_seconds / 3600.0) : "-",
                     any && h.preempted > 0 ? FormatBytes(h.lost_bytes) : "-", h.group.empty() ? "-" : Shown(GroupName(h.group)),
                     groups.count(r.run_id) ? FormatGroupState(*groups[r.run_id]) : "-"});
  }
  std::vector<std::size_t> width(table[0].size(), 0);
  for (auto const& row : table) {
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (auto const& row : table) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    std::puts(line.c_str());
  }
  for (auto const& r : rows) {
    if (!r.problem.empty()) std::fprintf(stderr, "spotvisor runs: %s: %s\n", Shown(r.run_id).c_str(), Shown(r.problem).c_str());
  }
  say_group_errors();
  return 0;
}

int GcRuns(const std::string& url, std::optional<int> keep, std::optional<std::chrono::milliseconds> older_than,
           bool apply, const RemoteOptions& o) {
  if (!keep && !older_than) {
    std::fprintf(stderr, "spotvisor gc: say which runs: --keep N and/or --older-than DURATION\n");
    return kExitUsage;
  }
  int rc = 0;
  auto store = OpenFor("gc", url, o, rc);
  if (!store) return rc;
  auto collected = CollectRuns(*store, url);
  if (!collected.ok()) {
    std::fprintf(stderr, "spotvisor gc: %s\n", collected.status().message().c_str());
    return 1;
  }
  // When each run last did something: its newest commit, or its status.
  struct Aged {
    const RunRow* run;
    std::optional<WallTime> last;
  };
  std::vector<Aged> runs;
  for (auto const& r : *collected) {
    auto last = ParseRfc3339(r.committed_at);
    if (auto s = ParseRfc3339(r.since); s && (!last || *s > *last)) last = s;
    runs.push_back({&r, last});
  }
  std::sort(runs.begin(), runs.end(), [](const Aged& a, const Aged& b) {
    if (a.last.has_value() != b.last.has_value()) return a.last.has_value();  // unknown ages last
    return a.last && b.last && *a.last > *b.last;
  });
  auto now = TheClock().WallNow();
  std::vector<const Aged*> doomed;
  int rank = 0;
  for (auto const& a : runs) {
    auto const& r = *a.run;
    // Newest first: every run takes its place in --keep's count, kept for
    // another reason or not.
    bool beyond_keep = !keep || rank++ >= *keep;
    // Live from the moment a VM claims it (before its restore, in every rank)
    // until it ends (issue #28); a claim nobody renews expires.
    if (!r.claims.problems.empty()) {
      std::printf("keep    %s: cannot read a claim on it (%s): it may be running\n", Shown(r.run_id).c_str(),
                  Shown(r.claims.problems.front()).c_str());
      continue;
    }
    const Claim* live = nullptr;
    std::chrono::seconds ttl = std::chrono::minutes(10);
    for (auto const& c : r.claims.claims) {
      ttl = std::max(ttl, c.ttl);
      if (c.LiveAt(now) && (!live || c.expires_at > live->expires_at)) live = &c;
    }
    if (live) {
      std::printf("keep    %s: %s holds a live claim on it (%s, renewed %s, expires %s)\n", Shown(r.run_id).c_str(),
                  Shown(live->instance).c_str(), Shown(live->state).c_str(), FormatRfc3339(live->renewed_at).c_str(),
                  FormatRfc3339(live->expires_at).c_str());
      continue;
    }
    if (r.state == "running") {
      std::printf("keep    %s: its VM says it is running (since %s)\n", Shown(r.run_id).c_str(), Shown(r.since).c_str());
      continue;
    }
    if (auto committed = ParseRfc3339(r.committed_at);
        r.state != "done" && committed && now - *committed < ttl + kClaimSkew) {
      std::printf("keep    %s: committed at %s, within a claim's lifetime (%lld s): it may still be running\n",
                  Shown(r.run_id).c_str(), FormatRfc3339(*committed).c_str(), static_cast<long long>(ttl.count()));
      continue;
    }
    bool old_enough = !older_than || (a.last && now - *a.last > *older_than);
    if (beyond_keep && old_enough) {
      doomed.push_back(&a);
    } else {
      std::printf("keep    %s (%s, last %s)\n", Shown(r.run_id).c_str(), r.state.c_str(),
                  a.last ? FormatRfc3339(*a.last).c_str() : "unknown");
    }
  }
  std::uint64_t bytes = 0;
  int objects = 0;
  for (auto const* a : doomed) {
    auto const& r = *a->run;
    bytes += r.objects_bytes;
    objects += r.objects;
    std::printf("%s %s (%s, last %s): %d object(s), %s\n", apply ? "delete " : "would delete", Shown(r.run_id).c_str(),
                r.state.c_str(), a->last ? FormatRfc3339(*a->last).c_str() : "unknown", r.objects,
                FormatBytes(r.objects_bytes).c_str());
  }
  if (!apply) {
    std::printf("dry run: %zu run(s), %d object(s), %s would be deleted; add --delete to delete them\n", doomed.size(),
                objects, FormatBytes(bytes).c_str());
    return 0;
  }
  int failed = 0, deleted = 0;
  for (auto const* a : doomed) {
    auto const& r = *a->run;
    // The manifest first: a VM restoring this run meanwhile finds no commit
    // rather than a commit whose objects are going.
    auto objects_in_order = r.object_list;
    std::stable_sort(objects_in_order.begin(), objects_in_order.end(), [&](const ObjectInfo& x, const ObjectInfo& y) {
      auto rankof = [&](const ObjectInfo& i) { return i.name == r.run_id + "/" + kManifestObject ? 0 : 1; };
      return rankof(x) < rankof(y);
    });
    for (auto const& obj : objects_in_order) {
      auto s = store->Delete(obj.name, Precondition{obj.generation}, Background());
      if (s.ok() || s.code() == StatusCode::kNotFound) {
        ++deleted;
        continue;
      }
      ++failed;
      std::fprintf(stderr, "spotvisor gc: %s: deleting %s: %s\n", Shown(r.run_id).c_str(), Shown(obj.name).c_str(),
                   s.message().c_str());
      break;  // the rest of this run stays; the next run is tried
    }
  }
  std::printf("deleted %d object(s) of %zu run(s)%s\n", deleted, doomed.size(),
              failed ? fmt::format("; {} run(s) could not be deleted completely (see above)", failed).c_str() : "");
  return failed ? 1 : 0;
}

namespace {
// A run's URL: gs://BUCKET/[PREFIX/]RUN_ID, s3://... or file:///PATH/RUN_ID,
// without trailing slashes, and its run id; false (said on stderr) if not.
bool RunUrl(const char* command, const std::string& url, std::string& u, std::string& run_id) {
  u = url;
  while (!u.empty() && u.back() == '/') u.pop_back();
  auto slash = u.rfind('/');
  run_id = slash == std::string::npos ? "" : u.substr(slash + 1);
  auto loc = ParseStoreLocation(u);
  if (!loc.ok() || run_id.empty() || (loc->scheme != "file" && loc->prefix.empty())) {
    std::fprintf(stderr, "spotvisor %s: \"%s\" is not gs://BUCKET/[PREFIX/]RUN_ID, s3://BUCKET/[PREFIX/]RUN_ID or file:///PATH/RUN_ID%s\n",
                 command, Shown(url).c_str(), loc.ok() ? "" : (": " + loc.status().message()).c_str());
    return false;
  }
  return true;
}
}  // namespace

int PullRun(const std::string& url, const std::string& dir_in, std::optional<std::int64_t> sequence,
            const RemoteOptions& o) {
  std::string u, run_id;
  if (!RunUrl("pull", url, u, run_id)) return kExitUsage;
  int rc = 0;
  auto store = OpenFor("pull", u, o, rc);
  if (!store) return rc;
  std::string dir = dir_in.empty() ? "./" + run_id : dir_in;
  SyncOptions so;
  so.checkpoint_dir = dir;
  so.run_id = run_id;
  so.parallelism = o.parallelism;
  SyncEngine engine(std::move(store), so, TheClock());
  // A long pull says how it goes, on stderr, every 5 s.
  engine.SetProgressHandler([](const SyncProgress& p) {
    auto left = p.SecondsLeft();
    std::fprintf(stderr, "spotvisor pull: %s of %s%s%s\n", FormatBytes(p.bytes_done).c_str(), FormatBytes(p.bytes_total).c_str(),
                 p.Rate() ? (", " + FormatRate(*p.Rate())).c_str() : "",
                 left ? fmt::format(", about {:.0f}s left", *left).c_str() : "");
  });
  CallContext ctx;
  ctx.clock = &TheClock();
  auto r = engine.Pull(sequence, ctx);
  if (!r.ok()) {
    std::fprintf(stderr, "spotvisor pull: %s\n", r.status().message().c_str());
    return 1;
  }
  std::printf("pulled commit #%lld of %s into %s: %d file(s), %d downloaded (%s), %d already there, in %.1fs%s\n",
              static_cast<long long>(r->sequence), Shown(u).c_str(), Shown(dir).c_str(), r->files, r->files_downloaded,
              FormatBytes(r->bytes_downloaded).c_str(), r->files - r->files_downloaded, r->seconds,
              r->done ? " (the run is done)" : "");
  if (r->pull_removed > 0) {
    std::printf("removed %d file(s) an earlier pull put there that this commit no longer holds or holds in another "
                "version\n",
                r->pull_removed);
  }
  if (r->set_aside > 0) {
    std::printf("set aside %d file(s) that are not this commit's (edited there, or not put there by a pull) in %s\n",
                r->set_aside, Shown(r->set_aside_dir).c_str());
  }
  if (!r->state_warning.empty()) std::fprintf(stderr, "spotvisor pull: warning: %s\n", r->state_warning.c_str());
  return 0;
}

int StopRun(const std::string& url, std::optional<std::chrono::milliseconds> wait, const RemoteOptions& o) {
  std::string u, run_id;
  if (!RunUrl("stop", url, u, run_id)) return kExitUsage;
  int rc = 0;
  auto store = OpenFor("stop", u, o, rc);
  if (!store) return rc;
  CallContext ctx;
  ctx.clock = &TheClock();
  ctx.deadline = TheClock().Now() + std::chrono::seconds(60);
  // A run that is not there is a typo, not a stop.
  auto listed = store->List("", ctx);
  if (!listed.ok()) {
    std::fprintf(stderr, "spotvisor stop: listing %s: %s\n", Shown(u).c_str(), listed.status().message().c_str());
    return 1;
  }
  bool is_run = false;
  for (auto const& obj : *listed) is_run = is_run || IsRunObject(obj.name);
  if (!is_run) {
    std::fprintf(stderr, "spotvisor stop: %s holds no run (no manifest, DONE, status.json, claims or boots); is the run id "
                         "right? `spotvisor runs` lists the runs under a prefix\n",
                 Shown(u).c_str());
    return 1;
  }
  if (auto done = store->ReadBytes(kDoneObject, nullptr, ctx); done.ok()) {
    std::printf("%s is done already (DONE): nothing to stop\n", Shown(run_id).c_str());
    return 0;
  }
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  const char* user = std::getenv("USER");
  Json marker = {{"version", 1},
                 {"requested_at", FormatRfc3339(TheClock().WallNow())},
                 {"by", fmt::format("spotvisor stop by {}@{}", user ? user : "?", host)}};
  Precondition absent;
  absent.if_generation_match = 0;
  auto w = store->UploadBytes(kStopObject, marker.dump(2, ' ', false, Json::error_handler_t::replace) + "\n", absent, ctx);
  if (!w.ok() && w.status().code() == StatusCode::kFailedPrecondition) {
    std::printf("a stop of %s was requested already (%s/%s is there)\n", Shown(run_id).c_str(), Shown(u).c_str(), kStopObject);
  } else if (!w.ok()) {
    std::fprintf(stderr, "spotvisor stop: writing %s/%s: %s\n", Shown(u).c_str(), kStopObject, w.status().message().c_str());
    return 1;
  } else {
    std::printf("stop requested: %s/%s written. The run's VMs see it within stop-check-interval (30 s by default), stop "
                "the trainer gracefully, sync and end the run (in a group: leave it); later boots do not train. Delete "
                "it to let the run go on.\n",
                Shown(u).c_str(), kStopObject);
  }
  std::fflush(stdout);
  if (!wait) return 0;
  auto until = TheClock().Now() + *wait;
  auto said = TheClock().Now();
  for (;;) {
    CallContext c;
    c.clock = &TheClock();
    c.deadline = TheClock().Now() + std::chrono::seconds(30);
    if (auto done = store->ReadBytes(kDoneObject, nullptr, c); done.ok()) {
      std::printf("%s is done (DONE)\n", Shown(run_id).c_str());
      return 0;
    }
    if (auto st = store->ReadBytes(kRunStatus, nullptr, c); st.ok()) {
      auto j = Json::parse(*st, nullptr, false);
      if (j.is_object() && Str(j, "state") == "ended") {
        std::printf("%s ended: %s (at %s)\n", Shown(run_id).c_str(), Shown(Str(j, "reason")).c_str(),
                    Shown(Str(j, "time")).c_str());
        return 0;
      }
    }
    if (TheClock().Now() >= until) {
      std::fprintf(stderr, "spotvisor stop: %s has not ended after %s; its VMs may be away, or still syncing\n",
                   Shown(run_id).c_str(), FormatDuration(*wait).c_str());
      return 2;
    }
    if (TheClock().Now() - said >= std::chrono::seconds(10)) {
      said = TheClock().Now();
      std::fprintf(stderr, "spotvisor stop: waiting for %s to end (its status.json)\n", Shown(run_id).c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

}  // namespace spotvisor
