#include "sync/completeness.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "common/strings.h"
#include "output/utf8.h"

namespace spotvisor::completeness {
namespace {

std::string Esc(const std::string& s) { return output::EscapeInvalidUtf8(s); }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string Base(const std::string& rel) {
  auto slash = rel.rfind('/');
  return slash == std::string::npos ? rel : rel.substr(slash + 1);
}

std::string Parent(const std::string& rel) {
  auto slash = rel.rfind('/');
  return slash == std::string::npos ? "" : rel.substr(0, slash);
}

bool Matches(const Convention& c, const std::string& name) {
  if (c.contains) return name.find(c.contains) != std::string::npos;
  std::string_view n = name;
  std::string_view prefix = c.prefix ? c.prefix : "";
  std::string_view suffix = c.suffix ? c.suffix : "";
  if (n.size() < prefix.size() + suffix.size() || n.substr(0, prefix.size()) != prefix ||
      n.substr(n.size() - suffix.size()) != suffix) {
    return false;
  }
  auto middle = n.substr(prefix.size(), n.size() - prefix.size() - suffix.size());
  if (c.digits) {
    return !middle.empty() && std::all_of(middle.begin(), middle.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  }
  return !(c.prefix && c.suffix) || middle.empty();
}

// The trailing digits of a name (global_step120 -> 120).
std::optional<std::uint64_t> TrailingNumber(std::string_view name) {
  std::size_t i = name.size();
  while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9') --i;
  if (i == name.size() || name.size() - i > 18) return std::nullopt;
  return std::stoull(std::string(name.substr(i)));
}

// A save: what the rules judge as one.
struct Unit {
  enum Kind { kLoose, kDir, kFile, kPointer } kind = kLoose;
  std::string key;  // the directory (kDir: "" for the checkpoint dir itself) or the file
  const Convention* convention = nullptr;
  std::vector<const File*> files;  // current
  std::vector<std::string> committed;  // committed paths in it
  bool changed = false;
  // The verdict on it.
  bool take = false;
  std::string rule;    // loose: which rule took it
  std::string reason;  // held: why
  std::vector<std::string> holding;
};

class Partition {
 public:
  explicit Partition(const Facts& f) {
    for (auto const& file : f.files) {
      names_.insert(file.rel);
      if (file.format != Format::kUnknown) known_format_.insert(file.rel);
    }
    for (auto const& [rel, c] : f.committed) names_.insert(rel);
    for (auto const& rel : names_) {
      if (EndsWith(rel, ".distcp")) distcp_dirs_.insert(Parent(rel));
    }
  }

  // Which save `rel` belongs to: the outermost directory a convention
  // recognises, else the file itself if it is self-contained or a pointer,
  // else the loose files.
  std::pair<Unit::Kind, std::string> UnitOf(const std::string& rel, const Convention** conv) const {
    *conv = nullptr;
    if (distcp_dirs_.count("")) {
      *conv = DcpConvention();
      return {Unit::kDir, ""};
    }
    std::size_t start = 0;
    for (;;) {
      auto slash = rel.find('/', start);
      if (slash == std::string::npos) break;
      auto dir = rel.substr(0, slash);
      auto name = rel.substr(start, slash - start);
      for (auto const& c : Conventions()) {
        if (c.kind != SaveKind::kDir) continue;
        bool named = (c.prefix || c.suffix || c.contains || c.digits) && Matches(c, name);
        if (!c.signature) {
          if (named) {
            *conv = &c;
            return {Unit::kDir, dir};
          }
          continue;
        }
        bool signed_ = c.signature_suffix ? distcp_dirs_.count(dir) > 0 : names_.count(dir + "/" + c.signature) > 0;
        bool any_name = !(c.prefix || c.suffix || c.contains || c.digits);
        if (signed_ && (named || any_name)) {
          *conv = &c;
          return {Unit::kDir, dir};
        }
      }
      start = slash + 1;
    }
    auto base = Base(rel);
    for (auto const& c : Conventions()) {
      // A self-contained file only when its format can vouch for it (a
      // `.ckpt` that is not a zip is judged with the loose files).
      if (c.kind == SaveKind::kFile && Matches(c, base) && known_format_.count(rel)) {
        *conv = &c;
        return {Unit::kFile, rel};
      }
      if (c.kind == SaveKind::kPointer && Matches(c, base)) {
        *conv = &c;
        return {Unit::kPointer, rel};
      }
    }
    return {Unit::kLoose, ""};
  }

  static const Convention* DcpConvention() {
    for (auto const& c : Conventions()) {
      if (c.signature && c.signature_suffix) return &c;
    }
    return nullptr;
  }

 private:
  std::set<std::string> names_;
  std::set<std::string> distcp_dirs_;
  std::set<std::string> known_format_;  // current files whose format was probed and said something
};

bool IsLog(const File& f) { return f.appending || IsLogName(f.rel); }

std::string Named(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kMaxNamed; ++i) out += (i ? ", " : "") + fmt::format("\"{}\"", Esc(names[i]));
  if (names.size() > kMaxNamed) out += fmt::format(" and {} more", names.size() - kMaxNamed);
  return out;
}

class Judge_ {
 public:
  explicit Judge_(const Facts& f) : f_(f), ended_(f.trainer_ended_ns > 0 ? f.trainer_ended_ns : f.now_ns) {}

  Verdict Run();

 private:
  bool Changed(const File& file) const {
    auto it = f_.committed.find(file.rel);
    return it == f_.committed.end() || it->second.size != file.size || it->second.mtime_ns != file.mtime_ns;
  }
  void JudgeDir(Unit& u) const;
  void JudgeFile(Unit& u) const;
  void JudgeLoose(Unit& u, int non_log_files) const;

  const Facts& f_;
  const std::int64_t ended_;
};

void Judge_::JudgeDir(Unit& u) const {
  auto const& c = *u.convention;
  std::string label = u.key.empty() ? std::string("the checkpoint dir") : fmt::format("\"{}/\"", Esc(u.key));
  if (u.files.empty()) {
    u.take = true;  // removed whole: the framework rotated it away
    return;
  }
  std::vector<std::string> open;
  for (auto const* file : u.files) {
    if (file->open_for_writing && f_.trainer == Trainer::kRunning) open.push_back(file->rel);
  }
  if (!open.empty()) {
    u.reason = fmt::format("{} ({}): {} open for writing", label, c.framework, Named(open));
    u.holding = open;
    return;
  }
  // Files it lost since the commit, and nothing new: the framework is
  // removing it (rotation); it goes whole, never half.
  bool lost = false, grew = false;
  std::set<std::string> now;
  for (auto const* file : u.files) {
    now.insert(file->rel);
    if (Changed(*file)) grew = true;
  }
  for (auto const& rel : u.committed) lost |= now.count(rel) == 0;
  if (lost && !grew) {
    u.take = true;
    u.files.clear();
    u.rule = "removed";
    return;
  }
  std::string prefix = u.key.empty() ? "" : u.key + "/";
  switch (c.evidence) {
    case Evidence::kAppeared:
      u.take = true;
      return;
    case Evidence::kLastFile: {
      const File* ev = nullptr;
      for (auto const* file : u.files) {
        if (file->rel == prefix + c.evidence_file) ev = file;
        if (c.unfinished_flag && file->rel == prefix + c.unfinished_flag) {
          u.reason = fmt::format("{} ({}): {} says a save into it is not finished", label, c.framework, c.unfinished_flag);
          u.holding = {file->rel};
          return;
        }
      }
      if (!ev) {
        u.reason = fmt::format("{} ({}): no {} yet, which it writes last", label, c.framework, c.evidence_file);
        u.holding = {prefix + c.evidence_file};
        return;
      }
      if (ev->format == Format::kTorn) {
        u.reason = fmt::format("{} ({}): {} is cut short", label, c.framework, c.evidence_file);
        u.holding = {ev->rel};
        return;
      }
      std::vector<std::string> newer;
      for (auto const* file : u.files) {
        if (file->mtime_ns > ev->mtime_ns && !(c.may_follow && StartsWith(Base(file->rel), c.may_follow))) {
          newer.push_back(file->rel);
        }
      }
      if (!newer.empty()) {
        u.reason = fmt::format("{} ({}): {} written after {}, which comes last: a new save into it is under way", label,
                               c.framework, Named(newer), c.evidence_file);
        u.holding = newer;
        return;
      }
      for (auto const* file : u.files) {
        if (file->format == Format::kTorn) {
          u.reason = fmt::format("{} ({}): \"{}\" is cut short", label, c.framework, Esc(file->rel));
          u.holding = {file->rel};
          return;
        }
      }
      u.take = true;
      return;
    }
    case Evidence::kPointerNames: {
      auto parent = Parent(u.key);
      auto pointer_rel = parent.empty() ? std::string(c.evidence_file) : parent + "/" + c.evidence_file;
      const File* p = nullptr;
      for (auto const& file : f_.files) {
        if (file.rel == pointer_rel) p = &file;
      }
      auto mine = TrailingNumber(Base(u.key));
      auto named = p ? TrailingNumber(p->pointer) : std::nullopt;
      if (p && named && mine && StartsWith(p->pointer, std::string(c.prefix ? c.prefix : "")) && *named >= *mine) {
        u.take = true;
        return;
      }
      u.reason = fmt::format("{} ({}): \"{}\" does not name it yet, and {} writes it after the save", label, c.framework,
                             Esc(pointer_rel), c.framework);
      u.holding = {pointer_rel};
      return;
    }
    case Evidence::kFormat:
    case Evidence::kNone:
      break;
  }
  u.reason = fmt::format("{} ({}): a save in progress", label, c.framework);
}

void Judge_::JudgeFile(Unit& u) const {
  auto const& file = *u.files.front();
  if (file.open_for_writing && f_.trainer == Trainer::kRunning) {
    u.reason = fmt::format("\"{}\" ({}): open for writing", Esc(file.rel), u.convention->framework);
    u.holding = {file.rel};
    return;
  }
  if (file.format == Format::kTorn) {
    u.reason = fmt::format("\"{}\" ({}): cut short (its format is not whole)", Esc(file.rel), u.convention->framework);
    u.holding = {file.rel};
    return;
  }
  if (file.format == Format::kWhole) {
    u.take = true;
    return;
  }
  // A format with nothing to check: judged by time, as loose files are.
  auto settle = std::max<std::int64_t>(f_.settle_ns, f_.trainer == Trainer::kKilled ? kTieFloorNs : 0);
  auto ref = f_.trainer == Trainer::kKilled ? ended_ : f_.now_ns;
  if (f_.trainer == Trainer::kExited || ref - file.mtime_ns >= settle) {
    u.take = true;
    return;
  }
  u.reason = fmt::format("\"{}\" ({}): changed within sync-settle", Esc(file.rel), u.convention->framework);
  u.holding = {file.rel};
}

void Judge_::JudgeLoose(Unit& u, int non_log_files) const {
  std::vector<std::string> torn, open, newer, ties;
  std::int64_t newest = 0;
  for (auto const* file : u.files) {
    newest = std::max(newest, file->mtime_ns);
    if (file->format == Format::kTorn) torn.push_back(file->rel);
    if (file->open_for_writing) open.push_back(file->rel);
    if (f_.marker_ns) {
      if (file->mtime_ns > *f_.marker_ns) newer.push_back(file->rel);
      else if (file->mtime_ns > *f_.marker_ns - kTickNs) ties.push_back(file->rel);
    }
  }
  bool running = f_.trainer == Trainer::kRunning;
  if (!running) open.clear();  // nothing runs to write them
  if (!torn.empty()) {
    u.reason = fmt::format("{} cut short (the file's own format is not whole)", Named(torn));
    u.holding = torn;
    return;
  }
  if (f_.marker_ns) {
    if (newer.empty() && ties.empty() && open.empty()) {
      u.take = true;
      u.rule = running ? "marker" : "exited";
      return;
    }
    if (newer.empty() && open.empty() && running && f_.now_ns - newest >= std::max(f_.settle_ns, kTieFloorNs)) {
      u.take = true;
      u.rule = "settle";
      return;
    }
    if (!newer.empty()) {
      u.reason = fmt::format("{} file(s) newer than .spotvisor-complete ({}): a save is under way; touch the marker after "
                             "its last file",
                             newer.size(), Named(newer));
      u.holding = newer;
    } else if (!open.empty()) {
      u.reason = fmt::format("{} open for writing though nothing is newer than .spotvisor-complete: the next save has "
                             "begun",
                             Named(open));
      u.holding = open;
    } else {
      u.reason = fmt::format("{} file(s) as new as .spotvisor-complete (the same clock tick: {}): written just before it "
                             "or just after it cannot be told apart; `spotvisor checkpoint --done` waits out the tick",
                             ties.size(), Named(ties));
      u.holding = ties;
    }
    return;
  }
  switch (f_.trainer) {
    case Trainer::kCompleted:
    case Trainer::kExited:
      u.take = true;
      u.rule = "exited";
      return;
    case Trainer::kKilled: {
      // Died of a signal: the files are a whole state only if none changed
      // within sync-settle (and at least 2 s) before it died, or the only
      // file's own format says it is whole (an atomic replace, a zip whose
      // end record is there).
      auto window = std::max(f_.settle_ns, kTieFloorNs);
      if (ended_ - newest >= window) {
        u.take = true;
        u.rule = "exited";
        return;
      }
      if (non_log_files == 1 && u.files.size() == 1 && u.files.front()->format == Format::kWhole) {
        u.take = true;
        u.rule = "one-file";
        return;
      }
      std::vector<std::string> recent;
      for (auto const* file : u.files) {
        if (ended_ - file->mtime_ns < window) recent.push_back(file->rel);
      }
      u.reason = fmt::format("the trainer died of a signal {:.1f} s after {} changed: it may have been cut off mid-save",
                             std::max<double>(0, static_cast<double>(ended_ - newest) / 1e9), Named(recent));
      u.holding = recent;
      return;
    }
    case Trainer::kRunning:
      break;
  }
  // Running, no marker.
  if (open.empty() && f_.now_ns - newest >= f_.settle_ns) {
    u.take = true;
    u.rule = "settle";
    return;
  }
  // One file, replaced whole each time (or written in place and closed):
  // every state it leaves is whole once nobody holds it open.
  if (open.empty() && non_log_files == 1 && u.files.size() == 1) {
    auto const& only = *u.files.front();
    bool known = f_.one_file_versions >= 2 || (f_.committed.size() == 1 && f_.committed.count(only.rel) > 0);
    if (known) {
      u.take = true;
      u.rule = "one-file";
      return;
    }
  }
  if (!open.empty()) {
    u.reason = fmt::format("{} open for writing: a save is under way (a file the trainer keeps open, such as a log, "
                           "belongs outside the checkpoint dir or opened for appending)",
                           Named(open));
    u.holding = open;
    return;
  }
  std::vector<std::string> recent;
  for (auto const* file : u.files) {
    if (f_.now_ns - file->mtime_ns < f_.settle_ns) recent.push_back(file->rel);
  }
  u.reason = fmt::format("{} changed within sync-settle ({} ms): a save may still be under way", Named(recent),
                         f_.settle_ns / 1'000'000);
  u.holding = recent;
}

Verdict Judge_::Run() {
  Verdict v;
  if (f_.trainer == Trainer::kCompleted) {
    v.complete = v.whole = true;
    v.by = "exited";
    for (auto const& file : f_.files) v.take.push_back(file.rel);
    return v;
  }
  Partition part(f_);
  std::map<std::pair<int, std::string>, Unit> units;
  std::vector<const File*> logs;
  int non_log = 0;
  auto unit_for = [&](const std::string& rel) -> Unit& {
    const Convention* conv = nullptr;
    auto [kind, key] = part.UnitOf(rel, &conv);
    auto& u = units[{static_cast<int>(kind), key}];
    u.kind = kind;
    u.key = key;
    if (conv) u.convention = conv;
    return u;
  };
  for (auto const& file : f_.files) {
    if (IsLog(file)) {
      logs.push_back(&file);
      continue;
    }
    ++non_log;
    auto& u = unit_for(file.rel);
    u.files.push_back(&file);
    u.changed |= Changed(file);
  }
  std::set<std::string> present;
  for (auto const& file : f_.files) present.insert(file.rel);
  std::set<std::string> log_names;
  for (auto const* l : logs) log_names.insert(l->rel);
  for (auto const& [rel, c] : f_.committed) {
    if (log_names.count(rel)) continue;
    auto& u = unit_for(rel);
    u.committed.push_back(rel);
    if (!present.count(rel)) u.changed = true;
  }
  // Directories first, then files and pointers (a pointer is whole when the
  // save it names is), then the loose files.
  auto judge = [&](Unit& u) {
    if (!u.changed) {
      u.take = true;
      return;
    }
    switch (u.kind) {
      case Unit::kDir: JudgeDir(u); break;
      case Unit::kFile:
        if (u.files.empty()) u.take = true;
        else JudgeFile(u);
        break;
      case Unit::kLoose: JudgeLoose(u, non_log); break;
      case Unit::kPointer: break;
    }
  };
  for (auto& [k, u] : units) {
    if (u.kind != Unit::kPointer) judge(u);
  }
  for (auto& [k, u] : units) {
    if (u.kind != Unit::kPointer || !u.changed) {
      if (u.kind == Unit::kPointer) u.take = true;
      continue;
    }
    if (u.files.empty()) {
      u.take = true;
      continue;
    }
    auto const& p = *u.files.front();
    auto target = Parent(p.rel).empty() ? p.pointer : Parent(p.rel) + "/" + p.pointer;
    auto it = units.find({static_cast<int>(Unit::kDir), target});
    bool open = p.open_for_writing && f_.trainer == Trainer::kRunning;
    if (!p.pointer.empty() && !open && it != units.end() && it->second.take && !it->second.files.empty()) {
      u.take = true;
    } else {
      u.reason = fmt::format("\"{}\" ({}): it names \"{}\", which is not a whole save here", Esc(p.rel),
                             u.convention->framework, Esc(p.pointer));
      u.holding = {p.rel};
    }
  }
  bool any_change = false, any_held = false, loose_taken_changed = false;
  std::string loose_rule;
  std::vector<std::string> reasons;
  for (auto& [k, u] : units) {
    if (u.take) {
      for (auto const* file : u.files) v.take.push_back(file->rel);
      any_change |= u.changed;
      if (u.kind == Unit::kLoose && u.changed) {
        loose_taken_changed = true;
        loose_rule = u.rule;
      }
      continue;
    }
    any_held = true;
    for (auto const& rel : u.committed) v.keep.push_back(rel);
    reasons.push_back(u.reason);
    v.left_out.push_back(u.reason);
    for (auto const& h : u.holding) {
      if (v.holding.size() < kMaxNamed) v.holding.push_back(Esc(h));
      else ++v.holding_more;
    }
    for (auto const* file : u.files) v.open_file_holds |= file->open_for_writing && f_.trainer == Trainer::kRunning;
  }
  for (auto const* l : logs) {
    bool open = l->open_for_writing && f_.trainer == Trainer::kRunning;
    if (!open) {
      v.take.push_back(l->rel);
      any_change |= Changed(*l);
    } else if (f_.committed.count(l->rel)) {
      v.keep.push_back(l->rel);
    }
  }
  std::sort(v.take.begin(), v.take.end());
  std::sort(v.keep.begin(), v.keep.end());
  if (!any_held) {
    v.complete = v.whole = true;
    v.by = loose_taken_changed ? loose_rule : (f_.trainer == Trainer::kRunning ? "saves" : "exited");
    // Logs still open are not taken: the tree is not "whole", but nothing
    // that is a save was held.
    v.whole = std::none_of(logs.begin(), logs.end(),
                           [&](const File* l) { return l->open_for_writing && f_.trainer == Trainer::kRunning; });
    if (!v.whole) v.by = loose_taken_changed ? loose_rule : "saves";
    return v;
  }
  std::string why;
  for (std::size_t i = 0; i < reasons.size(); ++i) why += (i ? "; " : "") + reasons[i];
  v.why = why;
  v.complete = any_change;
  v.by = v.complete ? (loose_taken_changed ? loose_rule : "saves") : "";
  return v;
}

}  // namespace

Verdict Judge(const Facts& facts) { return Judge_(facts).Run(); }

bool IsLogName(const std::string& rel) { return Base(rel).rfind("events.out.tfevents.", 0) == 0; }

bool IsInProgressDir(const std::string& name) {
  for (auto const& c : Conventions()) {
    if (c.kind == SaveKind::kTemp && Matches(c, name)) return true;
  }
  return false;
}

bool IsInProgressFile(const std::string& name) { return EndsWith(name, ".tmp"); }

Probe ProbeFor(const std::string& rel) {
  auto base = Base(rel);
  if (EndsWith(base, ".safetensors")) return Probe::kSafetensors;
  for (const char* s : {".pt", ".pth", ".bin", ".ckpt", ".keras"}) {
    if (EndsWith(base, s)) return Probe::kZip;
  }
  if (base == "trainer_state.json") return Probe::kJson;
  if (base == "latest") return Probe::kPointer;
  return Probe::kNone;
}

const std::vector<Convention>& Conventions() {
  static const std::vector<Convention> table = {
      {"Hugging Face Trainer", SaveKind::kDir, "checkpoint-", true, "", nullptr, nullptr, false, Evidence::kLastFile,
       "trainer_state.json", "rng_state",
       "config.json, the weights (model.safetensors or shards, then their index), tokenizer files, training_args.bin, "
       "optimizer.pt, scheduler.pt, rng_state.pth (one per rank, with no barrier), then trainer_state.json, all in "
       "place; `save_total_limit` removes the oldest afterwards, by directory mtime since 4.52; 5.x with "
       "`enable_jit_checkpoint` keeps `checkpoint-is-incomplete.txt` in it during a save (4.39 and later; source "
       "read at 4.56, 5.0 and 5.1)",
       "`get_last_checkpoint`: the highest `checkpoint-N` by name, without looking inside; then it needs "
       "trainer_state.json",
       "checkpoint-is-incomplete.txt"},
      {"Hugging Face Trainer 4.36-4.38", SaveKind::kTemp, "tmp-checkpoint-", false, nullptr, nullptr, nullptr, false,
       Evidence::kNone, nullptr, nullptr, "the same files into `tmp-checkpoint-N/`, then a rename to `checkpoint-N/`",
       "as above"},
      {"DeepSpeed", SaveKind::kDir, "global_step", true, "", nullptr, nullptr, false, Evidence::kPointerNames, "latest",
       nullptr,
       "each rank's `mp_rank_XX_model_states.pt` and `*zero_pp_rank_*_optim_states.pt` into `global_stepN/`, then "
       "rank 0 writes `latest` beside it (no barrier before it) and `zero_to_fp32.py`; no rotation",
       "`load_checkpoint(dir)` takes the tag `latest` names, without checking the directory"},
      {"DeepSpeed", SaveKind::kPointer, "latest", false, "", nullptr, nullptr, false, Evidence::kPointerNames, nullptr,
       nullptr, "one line naming the newest tag, written in place after the tag's own files", "read by `load_checkpoint`"},
      {"torch.distributed.checkpoint", SaveKind::kDir, nullptr, false, nullptr, nullptr, ".distcp", true,
       Evidence::kLastFile, ".metadata", nullptr,
       "each rank's `__R_N.distcp`, then the coordinator's `.metadata` (written as `.metadata.tmp`, fsynced, renamed) "
       "once every rank is done; no rotation",
       "`dcp.load` reads `.metadata` first; which directory is newest is the caller's choice"},
      {"Orbax", SaveKind::kTemp, nullptr, false, nullptr, ".orbax-checkpoint-tmp", nullptr, false, Evidence::kNone,
       nullptr, nullptr, "`N.orbax-checkpoint-tmp[-T]/`, renamed to `N/` when every host is done", "as below"},
      {"Orbax", SaveKind::kDir, "", true, "", nullptr, "_CHECKPOINT_METADATA", false, Evidence::kAppeared, nullptr,
       nullptr, "a step directory `N/` that appears by a rename once whole; older steps are deleted after it",
       "`CheckpointManager.latest_step()`: the highest `N/` whose name is final"},
      {"PyTorch Lightning", SaveKind::kFile, nullptr, false, ".ckpt", nullptr, nullptr, false, Evidence::kFormat, nullptr,
       nullptr,
       "`epoch=E-step=S.ckpt`, `last.ckpt`: one torch.save zip each, written in place (2.3 and before) or moved in "
       "from $TMPDIR (2.4 and later: a rename only on the same file system); `save_top_k` removes old ones afterwards",
       "`ckpt_path=\"last\"`: the newest `last*.ckpt` by mtime, without looking inside"},
      {"Keras", SaveKind::kFile, nullptr, false, ".keras", nullptr, nullptr, false, Evidence::kFormat, nullptr, nullptr,
       "`model.save(\"x.keras\")`: one zip, written in place", "`keras.models.load_model`; no resume of its own"},
  };
  return table;
}

std::string TableMarkdown() {
  auto raw = [](const Convention& c) -> std::string {
    if (c.contains) return fmt::format("*{}*", c.contains);
    return std::string(c.prefix ? c.prefix : "*") + (c.digits ? "N" : "") + (c.suffix ? c.suffix : "*");
  };
  auto name_of = [&](const Convention& c) { return fmt::format("`{}`", raw(c)); };
  std::string out = "| framework | recognised by | it writes | complete when | resumes from |\n|---|---|---|---|---|\n";
  for (auto const& c : Conventions()) {
    std::string recognise;
    switch (c.kind) {
      case SaveKind::kDir:
        recognise = c.signature ? (c.signature_suffix ? fmt::format("a directory holding `*{}` files", c.signature)
                                                      : fmt::format("a directory `{}/` holding `{}`", raw(c), c.signature))
                                : fmt::format("a directory `{}/`", raw(c));
        break;
      case SaveKind::kFile: recognise = fmt::format("a file {}", name_of(c)); break;
      case SaveKind::kPointer: recognise = fmt::format("a file {} beside `global_stepN/`", name_of(c)); break;
      case SaveKind::kTemp: recognise = fmt::format("a temporary name {}", name_of(c)); break;
    }
    std::string complete;
    switch (c.evidence) {
      case Evidence::kLastFile:
        complete = fmt::format("`{}` is there and whole, nothing in the directory is newer{}, nothing open for writing{}",
                               c.evidence_file,
                               c.may_follow ? fmt::format(" (but `{}*`, which other ranks write with no barrier)", c.may_follow)
                                            : "",
                               c.unfinished_flag ? fmt::format(", no `{}`", c.unfinished_flag) : "");
        break;
      case Evidence::kAppeared: complete = "as soon as it has its name (a rename), nothing open for writing"; break;
      case Evidence::kPointerNames:
        complete = c.kind == SaveKind::kPointer
                       ? "the directory it names is a whole save"
                       : fmt::format("`{}` beside it names it or a later step, nothing open for writing", c.evidence_file);
        break;
      case Evidence::kFormat: complete = "its zip ends in the end-of-central-directory record, not open for writing"; break;
      case Evidence::kNone: complete = "never: a save in progress, not synced"; break;
    }
    out += fmt::format("| {} | {} | {} | {} | {} |\n", c.framework, recognise, c.writes, complete, c.resumes);
  }
  return out;
}

}  // namespace spotvisor::completeness
