#include "sync/completeness.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "testing/files.h"

namespace spotvisor::completeness {
namespace {

constexpr std::int64_t kS = 1'000'000'000;
constexpr std::int64_t kNow = 1'000'000 * kS;

// A tree as the engine would describe it: times in seconds before kNow.
struct Tree {
  Facts f;
  Tree() {
    f.now_ns = kNow;
    f.settle_ns = 2 * kS;
  }
  Tree& File(const std::string& rel, double age_s, std::uint64_t size = 10, Format format = Format::kUnknown) {
    completeness::File file;
    file.rel = rel;
    file.size = size;
    file.mtime_ns = kNow - static_cast<std::int64_t>(age_s * kS);
    file.format = format;
    f.files.push_back(file);
    Sort();
    return *this;
  }
  Tree& Open(const std::string& rel, bool appending = false) {
    for (auto& file : f.files) {
      if (file.rel == rel) {
        file.open_for_writing = true;
        file.appending = appending;
      }
    }
    return *this;
  }
  Tree& Pointer(const std::string& rel, double age_s, const std::string& text) {
    File(rel, age_s, text.size(), Format::kWhole);
    for (auto& file : f.files) {
      if (file.rel == rel) file.pointer = text;
    }
    return *this;
  }
  // The last commit holds `rel` as it is now (same size and time).
  Tree& Committed(const std::string& rel) {
    for (auto const& file : f.files) {
      if (file.rel == rel) f.committed[rel] = {file.size, file.mtime_ns};
    }
    return *this;
  }
  // The last commit holds `rel` in another version.
  Tree& CommittedOld(const std::string& rel) {
    f.committed[rel] = {1, kNow - 1000 * kS};
    return *this;
  }
  Tree& Trainer(completeness::Trainer t, double ended_age_s = 0) {
    f.trainer = t;
    f.trainer_ended_ns = kNow - static_cast<std::int64_t>(ended_age_s * kS);
    return *this;
  }
  Tree& Marker(double age_s) {
    f.marker_ns = kNow - static_cast<std::int64_t>(age_s * kS);
    return *this;
  }
  void Sort() {
    std::sort(f.files.begin(), f.files.end(), [](auto const& a, auto const& b) { return a.rel < b.rel; });
  }
  Verdict Judge() const { return completeness::Judge(f); }
};

using V = std::vector<std::string>;

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_CASE("loose files: a pause inside a save shorter than sync-settle never splits it") {
  // model.pt of the new save is written, the trainer pauses (an
  // evaluation, a barrier), optimizer.pt of the old save is still there.
  Tree t;
  t.File("model.pt", 1.0).File("optimizer.pt", 100).Committed("optimizer.pt").CommittedOld("model.pt");
  SECTION("1 s into a pause, sync-settle 2 s: nothing is committed") {
    auto v = t.Judge();
    CHECK_FALSE(v.complete);
    CHECK(Has(v.why, "\"model.pt\" changed within sync-settle (2000 ms)"));
    CHECK(v.holding == V{"model.pt"});
  }
  SECTION("at sync-settle exactly, the save counts as over") {
    t.f.files[0].mtime_ns = kNow - 2 * kS;
    auto v = t.Judge();
    CHECK(v.complete);
    CHECK(v.whole);
    CHECK(v.by == "settle");
    CHECK(v.take == V{"model.pt", "optimizer.pt"});
  }
  SECTION("a file held open for writing holds it back, whatever its age") {
    t.f.files[0].mtime_ns = kNow - 60 * kS;
    t.Open("model.pt");
    auto v = t.Judge();
    CHECK_FALSE(v.complete);
    CHECK(Has(v.why, "\"model.pt\" open for writing"));
    CHECK(v.open_file_holds);
  }
}

TEST_CASE("one file: synced between saves once it has shown it is replaced whole") {
  Tree t;
  t.File("model.pt", 0.1);
  SECTION("the first version seen may be the first file of a longer save") {
    t.f.one_file_versions = 1;
    CHECK_FALSE(t.Judge().complete);
  }
  SECTION("a second version seen: each state is whole") {
    t.f.one_file_versions = 2;
    auto v = t.Judge();
    CHECK(v.complete);
    CHECK(v.by == "one-file");
  }
  SECTION("the last commit held just this file: whole at once") {
    t.CommittedOld("model.pt");
    t.f.one_file_versions = 1;
    CHECK(t.Judge().by == "one-file");
  }
  SECTION("held open for writing (an in-place save under way): not whole") {
    t.f.one_file_versions = 5;
    t.Open("model.pt");
    CHECK_FALSE(t.Judge().complete);
  }
  SECTION("a second file: the one-file rule no longer applies") {
    t.f.one_file_versions = 5;
    t.File("optimizer.pt", 0.1);
    CHECK_FALSE(t.Judge().complete);
  }
}

TEST_CASE("a trainer killed by a signal: only what was settled before it died, or shows it is whole, is taken") {
  Tree t;
  t.File("model.pt", 30).File("optimizer.pt", 1.5).CommittedOld("model.pt").CommittedOld("optimizer.pt");
  SECTION("a loose file changed 1.5 s before it died (sync-settle 2 s): the loose files keep their commit") {
    t.Trainer(Trainer::kKilled, 0);
    auto v = t.Judge();
    CHECK_FALSE(v.complete);
    CHECK(Has(v.why, "died of a signal"));
    CHECK(Has(v.why, "\"optimizer.pt\""));
  }
  SECTION("settled 3 s before it died: taken") {
    t.Trainer(Trainer::kKilled, 1.5);        // reaped 1.5 s ago
    t.f.files[1].mtime_ns = kNow - 5 * kS;  // so the last change came 3.5 s before the death
    auto v = t.Judge();
    CHECK(v.complete);
    CHECK(v.by == "exited");
  }
  SECTION("a zero sync-settle still waits 2 s before a death: a signal can cut a save that had no pause") {
    t.f.settle_ns = 0;
    t.Trainer(Trainer::kKilled, 0);
    CHECK_FALSE(t.Judge().complete);
  }
  SECTION("the marker after the last save: taken; a file newer than it: the commit stands") {
    t.Trainer(Trainer::kKilled, 0);
    t.Marker(1.0);
    CHECK(t.Judge().complete);
    t.Marker(2.0);
    auto v = t.Judge();
    CHECK_FALSE(v.complete);
    CHECK(Has(v.why, "newer than .spotvisor-complete"));
  }
  SECTION("exited on its own with an error: taken as it is") {
    t.Trainer(Trainer::kExited, 0);
    CHECK(t.Judge().by == "exited");
  }
  SECTION("a file whose own format says it is cut short is never taken, even after an exit with an error") {
    t.Trainer(Trainer::kExited, 0);
    t.f.files[0].format = Format::kTorn;
    auto v = t.Judge();
    CHECK_FALSE(v.complete);
    CHECK(Has(v.why, "\"model.pt\" cut short"));
  }
}

TEST_CASE("Hugging Face checkpoint-N/: whole when trainer_state.json, written last, is there and whole") {
  Tree t;
  t.File("checkpoint-6/model.safetensors", 20, 100, Format::kWhole)
      .File("checkpoint-6/optimizer.pt", 19, 100, Format::kWhole)
      .File("checkpoint-6/trainer_state.json", 18, 10, Format::kWhole);
  SECTION("killed mid-save of checkpoint-7: 6 is taken, 7 is left out and said so") {
    t.File("checkpoint-7/model.safetensors", 0.5, 100, Format::kWhole).File("checkpoint-7/optimizer.pt", 0.2, 40, Format::kTorn);
    t.Trainer(Trainer::kKilled, 0);
    auto v = t.Judge();
    CHECK(v.complete);
    CHECK_FALSE(v.whole);
    CHECK(v.by == "saves");
    CHECK(v.take == V{"checkpoint-6/model.safetensors", "checkpoint-6/optimizer.pt", "checkpoint-6/trainer_state.json"});
    CHECK(v.keep.empty());
    REQUIRE(v.left_out.size() == 1);
    CHECK(Has(v.left_out[0], "\"checkpoint-7/\" (Hugging Face Trainer): no trainer_state.json yet"));
  }
  SECTION("while running, a complete checkpoint is synced though the next one is being written") {
    t.File("checkpoint-7/model.safetensors", 0.1, 100, Format::kTorn).Open("checkpoint-7/model.safetensors");
    auto v = t.Judge();
    CHECK(v.complete);
    CHECK(v.take.size() == 3);
    CHECK(Has(v.why, "\"checkpoint-7/\" (Hugging Face Trainer): \"checkpoint-7/model.safetensors\" open for writing"));
  }
  SECTION("other ranks' rng_state files may land after trainer_state.json (no barrier)") {
    t.File("checkpoint-6/rng_state_1.pth", 17, 10, Format::kWhole);
    t.Trainer(Trainer::kKilled, 0);
    CHECK(t.Judge().whole);
  }
  SECTION("a weights file newer than trainer_state.json: a new save into the same directory") {
    t.f.files[0].mtime_ns = kNow - 1 * kS;
    t.Trainer(Trainer::kKilled, 0);
    auto v = t.Judge();
    CHECK_FALSE(v.complete);
    CHECK(Has(v.why, "written after trainer_state.json"));
  }
  SECTION("transformers 5's JIT checkpoint flag still there: the save is not finished, whatever else it holds") {
    // CheckpointManager writes checkpoint-is-incomplete.txt, saves, then
    // removes it: killed in between, trainer_state.json is there already.
    t.File("checkpoint-6/checkpoint-is-incomplete.txt", 30, 0, Format::kUnknown);
    t.Trainer(Trainer::kKilled, 0);
    auto v = t.Judge();
    CHECK_FALSE(v.complete);
    CHECK(Has(v.why, "checkpoint-is-incomplete.txt says a save into it is not finished"));
  }
  SECTION("trainer_state.json cut short (does not parse)") {
    t.f.files[2].format = Format::kTorn;
    t.Trainer(Trainer::kKilled, 0);
    CHECK(Has(t.Judge().why, "trainer_state.json is cut short"));
  }
  SECTION("an older checkpoint removed half-way by save_total_limit goes whole, never half") {
    for (auto const& f : t.f.files) t.f.committed[f.rel] = {f.size, f.mtime_ns};
    t.f.committed["checkpoint-5/model.safetensors"] = {100, kNow - 40 * kS};
    t.f.committed["checkpoint-5/trainer_state.json"] = {10, kNow - 39 * kS};
    t.File("checkpoint-5/trainer_state.json", 39, 10, Format::kWhole);  // model.safetensors already deleted
    t.Trainer(Trainer::kKilled, 0);
    auto v = t.Judge();
    CHECK(v.complete);
    CHECK(v.take == V{"checkpoint-6/model.safetensors", "checkpoint-6/optimizer.pt", "checkpoint-6/trainer_state.json"});
  }
  SECTION("a re-save into a committed directory that is not whole keeps the committed version") {
    for (auto const& f : t.f.files) t.f.committed[f.rel] = {f.size, f.mtime_ns};
    t.f.files[0].mtime_ns = kNow - 1 * kS;
    t.f.files[0].size = 7;
    t.Trainer(Trainer::kKilled, 0);
    auto v = t.Judge();
    CHECK_FALSE(v.complete);  // nothing else changed: the commit stands
    CHECK(v.keep.size() == 3);
  }
}

TEST_CASE("DeepSpeed global_stepN/ is whole when `latest` names it or a later step; `latest` when what it names is") {
  Tree t;
  t.File("global_step10/mp_rank_00_model_states.pt", 50, 100, Format::kWhole).Pointer("latest", 49, "global_step10");
  for (auto const& f : t.f.files) t.f.committed[f.rel] = {f.size, f.mtime_ns};
  t.File("global_step20/mp_rank_00_model_states.pt", 0.5, 100, Format::kWhole);
  t.Trainer(Trainer::kKilled, 0);
  SECTION("latest still names step 10: step 20 is left out") {
    auto v = t.Judge();
    CHECK_FALSE(v.complete);
    CHECK(Has(v.why, "\"global_step20/\" (DeepSpeed): \"latest\" does not name it yet"));
  }
  SECTION("latest names step 20: both taken") {
    t.f.files.erase(std::remove_if(t.f.files.begin(), t.f.files.end(), [](auto const& f) { return f.rel == "latest"; }),
                    t.f.files.end());
    t.Pointer("latest", 0.1, "global_step20");
    auto v = t.Judge();
    CHECK(v.whole);
    CHECK(v.take == V{"global_step10/mp_rank_00_model_states.pt", "global_step20/mp_rank_00_model_states.pt", "latest"});
  }
  SECTION("latest names a step that is not here: latest keeps its committed version") {
    t.f.files.erase(std::remove_if(t.f.files.begin(), t.f.files.end(), [](auto const& f) { return f.rel == "latest"; }),
                    t.f.files.end());
    t.Pointer("latest", 0.1, "global_step30");
    auto v = t.Judge();
    CHECK(v.complete);
    CHECK(v.keep == V{"latest"});
    CHECK(Has(v.why, "it names \"global_step30\""));
  }
}

TEST_CASE("torch.distributed.checkpoint: a directory of .distcp files is whole once .metadata lands after them") {
  Tree t;
  t.File("step-3/__0_0.distcp", 1, 100).File("step-3/__1_0.distcp", 1, 100);
  t.Trainer(Trainer::kKilled, 0);
  CHECK(Has(t.Judge().why, "\"step-3/\" (torch.distributed.checkpoint): no .metadata yet"));
  t.File("step-3/.metadata", 0.5, 10);
  CHECK(t.Judge().whole);
  SECTION("saved into the checkpoint dir itself") {
    Tree r;
    r.File("__0_0.distcp", 1, 100).File(".metadata", 3, 10).Trainer(Trainer::kKilled, 0);
    CHECK(Has(r.Judge().why, "the checkpoint dir (torch.distributed.checkpoint): \"__0_0.distcp\" written after .metadata"));
  }
}

TEST_CASE("Orbax: a step directory is whole when it has its name; its temporary name is never scanned") {
  Tree t;
  t.File("100/_CHECKPOINT_METADATA", 0.1).File("100/default/array.zarr", 0.1).Trainer(Trainer::kKilled, 0);
  CHECK(t.Judge().whole);
  CHECK(IsInProgressDir("100.orbax-checkpoint-tmp-1700000000"));
  CHECK(IsInProgressDir("100.orbax-checkpoint-tmp"));
  CHECK(IsInProgressDir("tmp-checkpoint-500"));
  CHECK_FALSE(IsInProgressDir("checkpoint-500"));
  SECTION("a plain directory named by digits is not Orbax's: loose files") {
    Tree r;
    r.File("100/weights.bin", 0.1).Trainer(Trainer::kKilled, 0);
    CHECK_FALSE(r.Judge().complete);
  }
}

TEST_CASE("self-contained files (.ckpt, .keras) are judged by their zip, not by time") {
  Tree t;
  t.File("epoch=3-step=300.ckpt", 0.1, 100, Format::kWhole).File("notes.txt", 0.1).Trainer(Trainer::kKilled, 0);
  auto v = t.Judge();
  CHECK(v.complete);
  CHECK(v.take == V{"epoch=3-step=300.ckpt"});  // notes.txt changed just before the death: held
  t.f.files[0].format = Format::kTorn;
  CHECK_FALSE(t.Judge().complete);
  SECTION("a .ckpt that is not a zip is a loose file") {
    Tree r;
    r.File("latest.ckpt", 0.1).Marker(0.05);
    CHECK(r.Judge().by == "marker");
  }
}

TEST_CASE("logs (held open for appending, TensorBoard event files) never hold a sync back, and go up once closed") {
  Tree t;
  t.File("model.pt", 30).File("train.log", 0.01).CommittedOld("train.log").Open("train.log", true);
  auto v = t.Judge();
  CHECK(v.complete);
  CHECK(v.by == "settle");
  CHECK(v.take == V{"model.pt"});
  CHECK(v.keep == V{"train.log"});
  CHECK(IsLogName("runs/Nov28/events.out.tfevents.1700000000.host.1.0"));
  SECTION("after the trainer stopped, the log is taken") {
    t.Trainer(Trainer::kKilled, 0);
    auto k = t.Judge();
    CHECK(std::find(k.take.begin(), k.take.end(), "train.log") != k.take.end());
  }
  SECTION("a file held open for writing without O_APPEND is a save under way") {
    t.f.files[1].appending = false;
    CHECK(t.Judge().open_file_holds);
  }
}

TEST_CASE("names: the conventions' patterns match exactly what the frameworks write") {
  CHECK(ProbeFor("checkpoint-5/model.safetensors") == Probe::kSafetensors);
  CHECK(ProbeFor("epoch=1-step=2.ckpt") == Probe::kZip);
  CHECK(ProbeFor("checkpoint-5/trainer_state.json") == Probe::kJson);
  CHECK(ProbeFor("latest") == Probe::kPointer);
  CHECK(ProbeFor("latest.txt") == Probe::kNone);
  Tree t;
  t.File("checkpoint-12a/x", 0.1).File("latest.ckpt", 0.1).Trainer(Trainer::kKilled, 0);
  // Neither is a framework's save: both are loose files, held together.
  auto v = t.Judge();
  CHECK_FALSE(v.complete);
  CHECK(Has(v.why, "\"checkpoint-12a/x\", \"latest.ckpt\""));
}

TEST_CASE("messages name at most five files, then how many more") {
  Tree t;
  for (int i = 0; i < 8; ++i) t.File("f" + std::to_string(i), 0.1);
  auto v = t.Judge();
  CHECK(v.holding.size() == kMaxNamed);
  CHECK(v.holding_more == 3);
  CHECK(Has(v.why, "and 3 more"));
  SECTION("names that are not UTF-8 are escaped") {
    Tree r;
    r.File("bad\xff", 0.1);
    CHECK(Has(r.Judge().why, "bad\\xff"));
  }
}

TEST_CASE("docs/checkpoints.md holds the framework table generated from the code") {
  const std::string path = std::string(SPOTVISOR_SOURCE_DIR) + "/docs/checkpoints.md";
  const std::string begin = "<!-- framework-table: generated from lib/sync/completeness.cc (completeness::TableMarkdown) -->\n";
  const std::string end = "<!-- end of framework-table -->";
  auto doc = testfiles::Read(path);
  auto b = doc.find(begin);
  auto e = doc.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  REQUIRE(b < e);
  auto want = TableMarkdown();
  auto have = doc.substr(b + begin.size(), e - b - begin.size());
  if (have != want && std::getenv("SPOTVISOR_UPDATE_DOCS")) {
    std::ofstream(path) << doc.substr(0, b + begin.size()) << want << doc.substr(e);
    have = want;
  }
  INFO("regenerate with: SPOTVISOR_UPDATE_DOCS=1 build-asan/tests/unit_tests \"docs/checkpoints.md holds*\"");
  CHECK(have == want);
}

}  // namespace
}  // namespace spotvisor::completeness
