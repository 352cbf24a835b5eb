// What may be committed: the rules that judge a checkpoint tree, kept apart
// from the engine that scans and uploads it (issue #29). Pure: facts about
// the tree (each file's size, time, inode, whether a process holds it open
// for writing, what its own format says of it), the completion marker, the
// trainer's state and the last commit go in; which files may be taken as
// they are now, which committed ones are kept instead, and why, come out.
//
// The tree is cut into saves:
//   - a framework's save directory (checkpoint-N/, global_stepN/, a
//     torch.distributed.checkpoint directory, an Orbax step), judged on its
//     own by the evidence its framework leaves last (Conventions());
//   - a self-contained file (a Lightning `.ckpt`, a Keras `.keras`), judged
//     by its own format;
//   - a pointer file (DeepSpeed's `latest`), whole when the save it names is;
//   - everything else, "the loose files", judged as one: by the marker, by
//     sync-settle, or as a one-file saver;
//   - logs (files held open for appending, TensorBoard event files), which
//     never hold a sync back and are taken once closed.
// Every save in a commit is one state its writer left whole; a save that is
// not whole keeps its committed version (or stays out).
//
// The table in docs/checkpoints.md is generated from Conventions()
// (TableMarkdown); a unit test keeps them equal.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace spotvisor::completeness {

// How the trainer stands when the tree is judged.
enum class Trainer {
  kRunning,    // a periodic or on-demand sync: a save may be under way
  kExited,     // exited on its own with a non-zero code (a crash, an error)
  kKilled,     // died of a signal (SIGINT's KeyboardInterrupt, the ladder's SIGTERM/SIGKILL,
               // the OOM killer), or a shell said so (exit 130, 137, 143): it may have died mid-save
  kCompleted,  // exited 0: every save it made is finished
};

// What a file's own structure says, for the kinds that have one (Probe).
enum class Format {
  kUnknown,  // not probed, or a kind with nothing to check
  kWhole,    // the structure is whole: a zip's end record, safetensors' length, JSON that parses
  kTorn,     // cut short, empty, or not what its name says
};

// What the engine must read of a file for the rules (from its name alone).
enum class Probe {
  kNone,
  kZip,          // torch.save (.pt, .pth, .bin, .ckpt) and Keras (.keras): a zip ends in its end record
  kSafetensors,  // 8-byte header length, JSON header, data: the size must add up
  kJson,         // a framework's small state file (trainer_state.json): it must parse
  kPointer,      // DeepSpeed's `latest`: its first line names a save
};

struct File {
  std::string rel;  // relative to the checkpoint dir
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::uint64_t ino = 0;
  bool open_for_writing = false;  // some process holds it open for writing now
  bool appending = false;         // ... with O_APPEND: a log
  Format format = Format::kUnknown;
  std::string pointer;  // kPointer: the first line, trimmed
};

struct CommittedFile {
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
};

struct Facts {
  std::vector<File> files;  // sorted by rel; without the marker and in-progress names
  std::optional<std::int64_t> marker_ns;  // .spotvisor-complete's mtime, if it exists
  std::map<std::string, CommittedFile> committed;  // the last commit this VM made or restored
  Trainer trainer = Trainer::kRunning;
  std::int64_t now_ns = 0;
  std::int64_t trainer_ended_ns = 0;  // kKilled: when it was reaped (0: unknown, `now` is used)
  std::int64_t settle_ns = 0;         // sync-settle
  // Versions of the tree's only file seen one after another while it was
  // the only one (the engine remembers this across scans): a one-file saver
  // shows itself by replacing that file.
  int one_file_versions = 0;
};

struct Verdict {
  // Something may be committed: `take` as the files are now plus `keep` as
  // committed. False: defer, nothing is committed (the bucket keeps its commit).
  bool complete = false;
  bool whole = false;  // with complete: every file is taken as it is now
  // complete: which rule let it through: marker, settle, one-file, final,
  // settled-before-death, saves (some saves taken, others kept back).
  std::string by;
  std::string why;  // !complete, or !whole: what holds a save back
  std::vector<std::string> take;  // current files taken as they are (sorted)
  std::vector<std::string> keep;  // committed files carried over unchanged: their save is not whole now
  // The files that hold a save back, for messages (at most kMaxNamed, then
  // `holding_more`); raw names: the caller escapes them.
  std::vector<std::string> holding;
  int holding_more = 0;
  // What was kept back, one line per save, for the one event that says so.
  std::vector<std::string> left_out;
  // A file in the tree is held open for writing though it is not a log:
  // the warning after repeated deferrals says to move it out or append.
  bool open_file_holds = false;
};

inline constexpr std::size_t kMaxNamed = 5;
// File times advance in clock ticks of at most 10 ms.
inline constexpr std::int64_t kTickNs = 10'000'000;
// Without sync-settle to go by, the marker's one-tick ties settle after this.
inline constexpr std::int64_t kTieFloorNs = 2'000'000'000;

Verdict Judge(const Facts& facts);

Probe ProbeFor(const std::string& rel);
// A TensorBoard event file (events.out.tfevents.*): appended to, never part of a save.
bool IsLogName(const std::string& rel);
// Names whose content is a save in progress (write-then-rename): never scanned.
bool IsInProgressDir(const std::string& name);
bool IsInProgressFile(const std::string& name);

// The framework conventions, as data.
enum class SaveKind {
  kDir,        // a save directory, judged by its evidence
  kFile,       // a self-contained file, judged by its format
  kPointer,    // a file naming the newest save beside it
  kTemp,       // a temporary name: a save in progress, never synced
};
enum class Evidence {
  kLastFile,      // `evidence` exists inside, is whole, and nothing in the directory is newer
  kAppeared,      // the directory got its name by a rename when the save was complete
  kPointerNames,  // the pointer file `evidence` beside it names this save or a later one
  kFormat,        // the file's own format is whole
  kNone,          // kTemp: never complete
};
struct Convention {
  const char* framework;
  SaveKind kind;
  // Name match on one path component: `prefix`, then digits (when
  // `digits`), then `suffix`; a null prefix or suffix matches anything, and
  // without digits a name with both is exactly prefix + suffix. A
  // `contains` text instead, when set.
  const char* prefix;
  bool digits;
  const char* suffix;
  const char* contains;
  // A file that must be inside the directory for it to be this framework's
  // (names that are otherwise too plain: Orbax's step `100/`), or a suffix of
  // one (`.distcp`) when `signature_suffix`; null: the name is enough.
  const char* signature;
  bool signature_suffix;
  Evidence evidence;
  const char* evidence_file;
  // kLastFile: names (a prefix) that may land after the evidence file and
  // still belong to the save (other ranks' files written without a barrier).
  const char* may_follow;
  // For the docs: how the framework writes it, and how it resumes.
  const char* writes;
  const char* resumes;
  // kLastFile: a file the framework keeps in the directory while a save is
  // under way (transformers 5's JIT checkpoint flag); null: none.
  const char* unfinished_flag = nullptr;
};
const std::vector<Convention>& Conventions();
std::string TableMarkdown();

}  // namespace spotvisor::completeness
