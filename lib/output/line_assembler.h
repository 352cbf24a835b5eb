// Turns a trainer's raw stdout or stderr bytes into log lines. Chunks arrive
// with arbitrary boundaries, so a line, a UTF-8 sequence or a "\r\n" pair may
// be split across calls; given the same arrival times, and a Tick whenever
// NextDeadline() passes (as the owner's timer does), where the splits fall
// never changes the result. Without that Tick, a chunk arriving after the
// deadline lets the waiting update out or supersedes it depending on whether
// a newer update ends inside the same Feed (fuzzing found this: fuzz/).
//
// Progress bars (tqdm and friends) redraw one line with '\r' many times a
// second. Logging every redraw would flood the logs, so redraws are collapsed:
// the first after a normal line is emitted at once, later ones at most once
// per progress_interval (on Feed or Tick), and a line end drops whatever is
// still waiting because the final text supersedes it.
//
// Rules, byte by byte:
//  - '\n' ends a line; a '\r' just before it is dropped (CRLF).
//  - A '\r' followed by anything else ends a progress segment. A '\r' at the
//    end of a chunk waits for the next byte (it may be half a CRLF).
//  - A line's text is what follows its last '\r', so "abc\rxy\n" logs "xy"
//    although a terminal would show "xyc": overdrawn leftovers are noise.
//  - Empty progress segments ("\r\r") are not emitted. If a redrawn line ends
//    with an empty segment ("a\rb\r\n"), nothing supersedes the last update,
//    so a waiting one is emitted rather than dropped.
//  - Text longer than max_line_bytes keeps its first max_line_bytes bytes,
//    cut back to a UTF-8 boundary; the rest is discarded as it arrives, so
//    memory stays near max_line_bytes per buffer whatever the trainer writes.
//  - Flush treats EOF as a line end, except that an empty final line is not
//    emitted; a '\r' waiting at EOF ends a progress segment (no '\n' follows).
//    A waiting update is emitted regardless of the interval, unless non-empty
//    trailing text supersedes it, exactly as a '\n' would.
//
// Bytes are not validated here; the logger escapes invalid UTF-8.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spotvisor::output {

struct OutputLine {
  std::string text;
  bool progress = false;  // A collapsed progress-bar redraw, not a full line.
  std::size_t truncated_bytes = 0;

  bool operator==(OutputLine const&) const = default;
};

struct LineAssemblerOptions {
  std::size_t max_line_bytes = 16384;
  std::chrono::milliseconds progress_interval{5000};
};

struct LineAssemblerCounters {
  std::uint64_t lines_emitted = 0;
  std::uint64_t progress_emitted = 0;
  // Every non-empty progress segment ends up emitted or suppressed.
  std::uint64_t progress_suppressed = 0;
  // Only bytes cut from emitted output; a suppressed update loses everything,
  // which progress_suppressed already counts.
  std::uint64_t bytes_truncated = 0;

  bool operator==(LineAssemblerCounters const&) const = default;
};

class LineAssembler {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  explicit LineAssembler(LineAssemblerOptions options = {});

  std::vector<OutputLine> Feed(std::string_view bytes, TimePoint now);
  // For the owner's timer: emits a waiting progress update once it is due.
  std::vector<OutputLine> Tick(TimePoint now);
  // At EOF. The assembler starts afresh afterwards.
  std::vector<OutputLine> Flush(TimePoint now);

  // When Tick would emit the waiting update; nullopt when nothing waits.
  std::optional<TimePoint> NextDeadline() const;

  LineAssemblerCounters const& counters() const { return counters_; }
  // Bytes held in buffers; bounded by about twice max_line_bytes.
  std::size_t buffered_bytes() const;

 private:
  void Append(std::string_view bytes);
  OutputLine TakeSegment(bool progress);
  void EndProgressSegment(TimePoint now, std::vector<OutputLine>& out);
  void EndLine(bool at_eof, TimePoint now, std::vector<OutputLine>& out);
  bool ProgressDue(TimePoint now) const;
  void EmitProgress(OutputLine line, TimePoint now, std::vector<OutputLine>& out);
  void EmitLine(OutputLine line, std::vector<OutputLine>& out);
  void EmitPendingIfDue(TimePoint now, std::vector<OutputLine>& out);

  LineAssemblerOptions options_;
  std::size_t segment_capacity_;
  std::string segment_;                // Text since the last '\n' or '\r'.
  std::size_t segment_discarded_ = 0;  // Bytes beyond segment_capacity_.
  bool cr_deferred_ = false;           // Chunk ended with '\r'.
  // Set while the current line is being redrawn; cleared by a line end so the
  // next bar's first update shows at once.
  std::optional<TimePoint> last_progress_emit_;
  std::optional<OutputLine> pending_;
  LineAssemblerCounters counters_;
};

}  // namespace spotvisor::output
