#include "output/line_assembler.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "output/utf8.h"

namespace Catch {
template <>
struct StringMaker<spotvisor::output::OutputLine> {
  static std::string convert(spotvisor::output::OutputLine const& l) {
    std::ostringstream os;
    os << (l.progress ? "Progress(" : "Line(") << '"' << l.text << '"';
    if (l.truncated_bytes != 0) os << ", truncated=" << l.truncated_bytes;
    os << ')';
    return os.str();
  }
};
}  // namespace Catch

namespace spotvisor::output {
namespace {

using std::chrono::milliseconds;
using TimePoint = LineAssembler::TimePoint;
using Lines = std::vector<OutputLine>;

TimePoint const kT0 = TimePoint{} + std::chrono::hours(1);

OutputLine Line(std::string text, std::size_t truncated = 0) {
  return OutputLine{std::move(text), false, truncated};
}
OutputLine Progress(std::string text, std::size_t truncated = 0) {
  return OutputLine{std::move(text), true, truncated};
}

void Append(Lines& to, Lines from) {
  to.insert(to.end(), from.begin(), from.end());
}

Lines FeedChunks(LineAssembler& a, std::vector<std::string> const& chunks,
                 TimePoint now = kT0) {
  Lines out;
  for (auto const& c : chunks) Append(out, a.Feed(c, now));
  return out;
}

// Feeds whole chunks then flushes, all at one instant.
Lines Run(std::vector<std::string> const& chunks, LineAssemblerOptions options = {}) {
  LineAssembler a(options);
  auto out = FeedChunks(a, chunks);
  Append(out, a.Flush(kT0));
  return out;
}

TEST_CASE("newlines end lines and CRLF loses its CR", "[line_assembler]") {
  LineAssembler a;
  CHECK(a.Feed("one\ntwo\r\n\nthree", kT0) == Lines{Line("one"), Line("two"), Line("")});
  CHECK(a.Flush(kT0) == Lines{Line("three")});
  CHECK(a.counters().lines_emitted == 4);
  CHECK(a.Flush(kT0).empty());
}

TEST_CASE("CRLF split across chunks is still a line end", "[line_assembler]") {
  LineAssembler a;
  // The CR alone is ambiguous, so nothing may come out yet.
  CHECK(a.Feed("loss=0.5\r", kT0).empty());
  CHECK_FALSE(a.NextDeadline().has_value());
  CHECK(a.Feed("\nnext", kT0) == Lines{Line("loss=0.5")});
  CHECK(a.Feed("\r", kT0).empty());
  CHECK(a.Feed("\n", kT0) == Lines{Line("next")});
  CHECK(a.counters().progress_emitted == 0);
}

TEST_CASE("a deferred CR followed by text is a progress update", "[line_assembler]") {
  LineAssembler a;
  CHECK(a.Feed("10%\r", kT0).empty());
  CHECK(a.Feed("20%\n", kT0) == Lines{Progress("10%"), Line("20%")});
}

TEST_CASE("text after the last CR is the line", "[line_assembler]") {
  // A terminal would show "xyc"; the overdrawn leftover is deliberately not logged.
  CHECK(Run({"abc\rxy\n"}) == Lines{Progress("abc"), Line("xy")});
}

TEST_CASE("empty progress segments are not emitted", "[line_assembler]") {
  CHECK(Run({"\r\r\rabc\n"}) == Lines{Line("abc")});
  CHECK(Run({"\r\r\n"}) == Lines{Line("")});
  LineAssembler a;
  CHECK(a.Feed("a\r\r\rb\r\r", kT0) == Lines{Progress("a")});
  CHECK(a.counters().progress_suppressed == 0);
  CHECK(a.NextDeadline() == kT0 + milliseconds(5000));
}

TEST_CASE("1000 updates within a second collapse to the first", "[line_assembler]") {
  // tqdm style: each redraw starts with '\r', so an update is complete once
  // the next one begins, and the newest one is still open.
  LineAssembler a;
  Lines out;
  for (int i = 0; i < 1000; ++i) {
    Append(out, a.Feed("\rstep " + std::to_string(i), kT0 + milliseconds(i)));
  }
  CHECK(out == Lines{Progress("step 0")});  // emitted at 1 ms, by step 1
  CHECK(a.counters().progress_emitted == 1);
  CHECK(a.counters().progress_suppressed == 997);  // step 998 is pending
  CHECK(a.NextDeadline() == kT0 + milliseconds(5001));

  CHECK(a.Tick(kT0 + milliseconds(5000)).empty());
  CHECK(a.Tick(kT0 + milliseconds(5001)) == Lines{Progress("step 998")});
  CHECK_FALSE(a.NextDeadline().has_value());
  CHECK(a.Tick(kT0 + milliseconds(20000)).empty());
  CHECK(a.counters().progress_emitted == 2);
  CHECK(a.counters().progress_suppressed == 997);
  CHECK(a.Feed("\n", kT0 + milliseconds(20001)) == Lines{Line("step 999")});
}

TEST_CASE("updates ending in CR wait for the next byte", "[line_assembler]") {
  LineAssembler a;
  CHECK(a.Feed("step 0\r", kT0).empty());
  CHECK(a.Feed("step 1\r", kT0 + milliseconds(1)) == Lines{Progress("step 0")});
  CHECK(a.Feed("step 2\r", kT0 + milliseconds(2)).empty());
  CHECK(a.NextDeadline() == kT0 + milliseconds(5001));
  CHECK(a.Tick(kT0 + milliseconds(5001)) == Lines{Progress("step 1")});
}

TEST_CASE("the interval runs from the last emission", "[line_assembler]") {
  LineAssembler a;
  CHECK(a.Feed("a\rb", kT0) == Lines{Progress("a")});
  CHECK(a.Feed("\rc", kT0 + milliseconds(1000)).empty());
  // A late timer emits late; the next deadline counts from then.
  CHECK(a.Tick(kT0 + milliseconds(7000)) == Lines{Progress("b")});
  CHECK(a.Feed("\rd", kT0 + milliseconds(8000)).empty());
  CHECK(a.NextDeadline() == kT0 + milliseconds(12000));
}

TEST_CASE("a due update is emitted by the next Feed", "[line_assembler]") {
  LineAssembler a;
  REQUIRE(a.Feed("a\rb\rc", kT0) == Lines{Progress("a")});
  REQUIRE(a.NextDeadline() == kT0 + milliseconds(5000));
  SECTION("newer update in the chunk supersedes the pending one") {
    CHECK(a.Feed("\rd", kT0 + milliseconds(6000)) == Lines{Progress("c")});
    CHECK(a.counters().progress_suppressed == 1);
    CHECK_FALSE(a.NextDeadline().has_value());
  }
  SECTION("a partial chunk lets the pending one out") {
    CHECK(a.Feed("c", kT0 + milliseconds(6000)) == Lines{Progress("b")});
    CHECK(a.counters().progress_suppressed == 0);
  }
  SECTION("an empty chunk acts as a Tick") {
    CHECK(a.Feed("", kT0 + milliseconds(5000)) == Lines{Progress("b")});
  }
  SECTION("not yet due stays pending") {
    CHECK(a.Feed("c", kT0 + milliseconds(4999)).empty());
    CHECK(a.NextDeadline() == kT0 + milliseconds(5000));
  }
}

TEST_CASE("the final line of a progress bar supersedes the pending update",
          "[line_assembler]") {
  LineAssembler a;
  CHECK(a.Feed("0%\r50%\r100%\n", kT0) == Lines{Progress("0%"), Line("100%")});
  CHECK(a.counters().progress_suppressed == 1);
  CHECK_FALSE(a.NextDeadline().has_value());
  // The next bar starts afresh: its first update is shown at once.
  CHECK(a.Feed("epoch 2 0%\r1%", kT0 + milliseconds(1)) == Lines{Progress("epoch 2 0%")});
}

TEST_CASE("a bar ending in an empty segment keeps its last update", "[line_assembler]") {
  LineAssembler a;
  // Nothing follows the last redraw, so "b" is the line's final state.
  CHECK(a.Feed("a\rb\r\r\n", kT0) == Lines{Progress("a"), Progress("b")});
  CHECK(a.counters().progress_suppressed == 0);
  CHECK(a.counters().lines_emitted == 0);
  CHECK(a.Feed("c\r\r\n", kT0) == Lines{Progress("c")});
}

TEST_CASE("Flush", "[line_assembler]") {
  SECTION("emits the partial line") {
    CHECK(Run({"abc"}) == Lines{Line("abc")});
  }
  SECTION("emits nothing when nothing is buffered") {
    CHECK(Run({}).empty());
    CHECK(Run({"abc\n"}) == Lines{Line("abc")});
  }
  SECTION("the partial line supersedes the pending update") {
    LineAssembler a;
    CHECK(a.Feed("a\rb\rc", kT0) == Lines{Progress("a")});
    CHECK(a.Flush(kT0) == Lines{Line("c")});
    CHECK(a.counters().progress_suppressed == 1);
  }
  SECTION("emits the pending update regardless of the interval") {
    LineAssembler a;
    CHECK(a.Feed("a\rb\r", kT0) == Lines{Progress("a")});
    CHECK(a.Flush(kT0) == Lines{Progress("b")});
    CHECK_FALSE(a.NextDeadline().has_value());
  }
  SECTION("a CR at EOF ends a progress segment") {
    CHECK(Run({"abc\r"}) == Lines{Progress("abc")});
  }
  SECTION("starts afresh") {
    LineAssembler a;
    a.Feed("a\rb\r", kT0);
    a.Flush(kT0);
    CHECK(a.Feed("x\ry", kT0) == Lines{Progress("x")});
  }
  SECTION("truncates the partial line") {
    CHECK(Run({"abcdefghij"}, {4, milliseconds(5000)}) == Lines{Line("abcd", 6)});
  }
}

TEST_CASE("truncation at the limit", "[line_assembler]") {
  LineAssemblerOptions const options{8, milliseconds(5000)};
  CHECK(Run({"12345678\n"}, options) == Lines{Line("12345678")});
  CHECK(Run({"123456789\n"}, options) == Lines{Line("12345678", 1)});
  CHECK(Run({"12345678\r\n"}, options) == Lines{Line("12345678")});
  CHECK(Run({"123456789abc\rxy\n"}, options) ==
        Lines{Progress("12345678", 4), Line("xy")});
  LineAssembler a(options);
  a.Feed("123456789\n1234567890\r", kT0);
  a.Flush(kT0);
  CHECK(a.counters().bytes_truncated == 3);
}

TEST_CASE("truncation does not split a multi-byte character", "[line_assembler]") {
  LineAssemblerOptions const options{5, milliseconds(5000)};
  CHECK(Run({"abcd日\n"}, options) == Lines{Line("abcd", 3)});
  CHECK(Run({"abc日\n"}, options) == Lines{Line("abc", 3)});
  CHECK(Run({"ab日\n"}, options) == Lines{Line("ab日")});
  // Every limit across a 4-byte emoji, fed one byte at a time.
  std::string const text = "ab\xF0\x9F\x98\x80" "cd";
  for (std::size_t max = 0; max <= text.size() + 1; ++max) {
    INFO("max=" << max);
    std::vector<std::string> bytes;
    for (char c : text + "\n") bytes.emplace_back(1, c);
    auto const out = Run(bytes, {max, milliseconds(5000)});
    REQUIRE(out.size() == 1);
    auto const& line = out[0];
    CHECK(line.text.size() <= max);
    CHECK(IsValidUtf8(line.text));
    CHECK(text.compare(0, line.text.size(), line.text) == 0);
    CHECK(line.text.size() + line.truncated_bytes == text.size());
    // Largest boundary: one more character would not have fitted.
    std::size_t const boundaries[] = {0, 1, 2, 6, 7, 8};
    std::size_t best = 0;
    for (auto b : boundaries) {
      if (b <= max) best = b;
    }
    CHECK(line.text.size() == best);
  }
}

TEST_CASE("gigantic output without a newline stays bounded", "[line_assembler]") {
  LineAssembler a;  // default 16 KiB limit
  std::string const chunk(1 << 20, 'x');
  std::size_t const kChunks = 64;  // 64 MiB, 4096 times the limit
  for (std::size_t i = 0; i < kChunks; ++i) {
    REQUIRE(a.Feed(chunk, kT0).empty());
    REQUIRE(a.buffered_bytes() <= 16384 + 3);
  }
  auto const out = a.Feed("\nafter\n", kT0);
  std::size_t const total = kChunks * chunk.size();
  REQUIRE(out.size() == 2);
  CHECK(out[0] == Line(std::string(16384, 'x'), total - 16384));
  CHECK(out[1] == Line("after"));
  CHECK(a.counters().bytes_truncated == total - 16384);
  CHECK(a.buffered_bytes() == 0);
}

TEST_CASE("a flood of huge progress updates stays bounded", "[line_assembler]") {
  LineAssembler a(LineAssemblerOptions{64, milliseconds(5000)});
  std::string const update = std::string(10000, 'p') + "\r";
  for (int i = 0; i < 100; ++i) {
    a.Feed(update, kT0);
    REQUIRE(a.buffered_bytes() <= 2 * (64 + 3));
  }
  // The last CR is still undecided, so update 100 is not counted yet.
  CHECK(a.counters().progress_emitted == 1);
  CHECK(a.counters().progress_suppressed == 97);
  CHECK(a.Flush(kT0) == Lines{Progress(std::string(64, 'p'), 10000 - 64)});
  CHECK(a.counters().progress_suppressed == 98);
}

// Covers CRLF, redraws, empty segments, multi-byte text and truncation, so
// that some chunk boundary falls inside each of them.
std::string const kMixed =
    "epoch 1\r\n"
    "\r  0%|\r 10%|#\r 20%|##\r\r100%|##########\n"
    "日本語 and \xF0\x9F\x98\x80 emoji\n"
    "\n\r\n"
    "a\rb\r\r\n"
    "long line that will be truncated 日本\n"
    "progress \xE6\x97\xA5\xE6\x97\xA5\xE6\x97\xA5\xE6\x97\xA5\r"
    "\xE6\x97\xA5 done\r\n"
    "invalid \xE6\x97 bytes \x80 kept\n"
    "trailing\rpartial";

void CheckChunkingIrrelevant(LineAssemblerOptions options) {
  LineAssembler whole(options);
  auto const expected = Run({kMixed}, options);
  // Sanity: the input exercises what it claims to.
  REQUIRE(expected.size() > 8);

  auto run_counted = [&](std::vector<std::string> const& chunks) {
    LineAssembler a(options);
    auto out = FeedChunks(a, chunks);
    Append(out, a.Flush(kT0));
    return std::make_pair(out, a.counters());
  };
  auto const [reference, reference_counters] = run_counted({kMixed});

  SECTION("one byte at a time") {
    std::vector<std::string> bytes;
    for (char c : kMixed) bytes.emplace_back(1, c);
    auto const [out, counters] = run_counted(bytes);
    CHECK(out == expected);
    CHECK(counters == reference_counters);
  }
  SECTION("split at every position") {
    for (std::size_t i = 0; i <= kMixed.size(); ++i) {
      INFO("split at " << i);
      auto const [out, counters] = run_counted({kMixed.substr(0, i), kMixed.substr(i)});
      REQUIRE(out == expected);
      REQUIRE(counters == reference_counters);
    }
  }
  SECTION("random chunk sizes") {
    std::mt19937 rng(12345);
    std::uniform_int_distribution<std::size_t> size(0, 12);
    for (int trial = 0; trial < 500; ++trial) {
      std::vector<std::string> chunks;
      for (std::size_t i = 0; i < kMixed.size();) {
        auto const n = size(rng);  // zero-length chunks included on purpose
        chunks.push_back(kMixed.substr(i, n));
        i += n;
      }
      INFO("trial " << trial);
      auto const [out, counters] = run_counted(chunks);
      REQUIRE(out == expected);
      REQUIRE(counters == reference_counters);
    }
  }
}

TEST_CASE("chunk boundaries do not change the result", "[line_assembler]") {
  SECTION("rate-limited") { CheckChunkingIrrelevant({24, milliseconds(5000)}); }
  SECTION("every update shown") { CheckChunkingIrrelevant({24, milliseconds(0)}); }
}

TEST_CASE("the mixed input gives the documented result", "[line_assembler]") {
  auto const out = Run({kMixed}, {24, milliseconds(5000)});
  Lines const expected = {
      Line("epoch 1"),
      Progress("  0%|"),
      Line("100%|##########"),
      Line("日本語 and \xF0\x9F\x98\x80 emoji"),
      Line(""),
      Line(""),
      Progress("a"),
      Progress("b"),
      Line("long line that will be t", 15),
      Progress("progress \xE6\x97\xA5\xE6\x97\xA5\xE6\x97\xA5\xE6\x97\xA5"),
      Line("\xE6\x97\xA5 done"),
      Line("invalid \xE6\x97 bytes \x80 kept"),
      Progress("trailing"),
      Line("partial"),
  };
  CHECK(out == expected);
}

// The timing-independent part of the contract, computed naively from the
// whole input: every item that may appear, in order, and which must.
struct Expected {
  OutputLine line;
  bool required;
};

OutputLine Truncate(std::string const& text, bool progress, std::size_t max) {
  if (text.size() <= max) return OutputLine{text, progress, 0};
  auto const keep = Utf8SafePrefixLength(text, max);
  return OutputLine{text.substr(0, keep), progress, text.size() - keep};
}

std::vector<std::string> SplitOn(std::string const& s, char sep) {
  std::vector<std::string> parts(1);
  for (char c : s) {
    if (c == sep) {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  return parts;
}

std::vector<Expected> Model(std::string const& input, std::size_t max) {
  std::vector<Expected> model;
  auto lines = SplitOn(input, '\n');
  for (std::size_t i = 0; i < lines.size(); ++i) {
    bool const complete = i + 1 < lines.size();
    auto line = lines[i];
    if (complete && !line.empty() && line.back() == '\r') line.pop_back();
    auto const segments = SplitOn(line, '\r');
    std::vector<std::string> updates;
    for (std::size_t s = 0; s + 1 < segments.size(); ++s) {
      if (!segments[s].empty()) updates.push_back(segments[s]);
    }
    auto const& final_text = segments.back();
    for (std::size_t u = 0; u < updates.size(); ++u) {
      bool const last_shown = u + 1 == updates.size() && final_text.empty();
      model.push_back({Truncate(updates[u], true, max), u == 0 || last_shown});
    }
    if (!final_text.empty() || (complete && updates.empty())) {
      model.push_back({Truncate(final_text, false, max), true});
    }
  }
  return model;
}

// Whether out is model with some optional items left out. Texts repeat, so a
// greedy match could pair an output with the wrong item; this searches.
bool MatchesModel(Lines const& out, std::vector<Expected> const& model) {
  // can[i][j]: out[i..] matches model[j..].
  std::vector<std::vector<char>> can(out.size() + 1,
                                     std::vector<char>(model.size() + 1, 0));
  can[out.size()][model.size()] = 1;
  for (std::size_t j = model.size(); j-- > 0;) {
    for (std::size_t i = out.size() + 1; i-- > 0;) {
      bool const skip = !model[j].required && can[i][j + 1];
      bool const take = i < out.size() && out[i] == model[j].line && can[i + 1][j + 1];
      can[i][j] = skip || take;
    }
  }
  return can[0][0] != 0;
}

TEST_CASE("random input, chunks and clock agree with a naive model", "[line_assembler]") {
  std::mt19937 rng(424242);
  std::vector<std::string> const pieces = {
      "a", "bc", "def", "\r", "\r", "\n", "\r\n", "日", "\xF0\x9F\x98\x80", "xxxxxxxxx"};
  std::uniform_int_distribution<std::size_t> pick(0, pieces.size() - 1);
  std::uniform_int_distribution<int> piece_count(0, 60);
  std::uniform_int_distribution<std::size_t> chunk_size(0, 7);
  std::uniform_int_distribution<int> step_ms(0, 2500);
  std::bernoulli_distribution zero_interval(0.1);
  std::size_t const kMax = 6;

  for (int trial = 0; trial < 3000; ++trial) {
    INFO("trial " << trial);
    std::string input;
    for (int n = piece_count(rng); n > 0; --n) input += pieces[pick(rng)];
    auto const interval = milliseconds(zero_interval(rng) ? 0 : 2000);
    LineAssembler a({kMax, interval});
    Lines out;
    auto now = kT0;
    for (std::size_t i = 0; i < input.size();) {
      now += milliseconds(step_ms(rng));
      // NextDeadline must predict exactly what a Tick does.
      auto const deadline = a.NextDeadline();
      auto const ticked = a.Tick(now);
      REQUIRE(ticked.size() == (deadline && *deadline <= now ? 1U : 0U));
      Append(out, ticked);
      auto const n = chunk_size(rng);
      Append(out, a.Feed(input.substr(i, n), now));
      i += n;
      // Feed leaves nothing overdue behind.
      if (auto d = a.NextDeadline()) REQUIRE(*d > now);
    }
    Append(out, a.Flush(now));
    REQUIRE_FALSE(a.NextDeadline().has_value());

    auto const model = Model(input, kMax);
    INFO("input " << Catch::Detail::stringify(input));
    INFO("output " << Catch::Detail::stringify(out));
    REQUIRE(MatchesModel(out, model));

    std::size_t updates = 0;
    for (auto const& e : model) updates += e.line.progress ? 1 : 0;
    LineAssemblerCounters tally;
    for (auto const& line : out) {
      (line.progress ? tally.progress_emitted : tally.lines_emitted) += 1;
      tally.bytes_truncated += line.truncated_bytes;
    }
    tally.progress_suppressed = updates - tally.progress_emitted;
    REQUIRE(a.counters() == tally);
    if (interval.count() == 0) REQUIRE(a.counters().progress_suppressed == 0);
  }
}

}  // namespace
}  // namespace spotvisor::output
