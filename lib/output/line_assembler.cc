#include "output/line_assembler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "output/utf8.h"

namespace spotvisor::output {
namespace {

// Slack past max_line_bytes so that a cut at the limit can see whether it
// lands inside a multi-byte sequence (the longest is 4 bytes).
constexpr std::size_t kUtf8Slack = 3;

std::size_t SegmentCapacity(std::size_t max_line_bytes) {
  auto constexpr kMax = std::numeric_limits<std::size_t>::max();
  return max_line_bytes > kMax - kUtf8Slack ? kMax : max_line_bytes + kUtf8Slack;
}

}  // namespace

LineAssembler::LineAssembler(LineAssemblerOptions options)
    : options_(options), segment_capacity_(SegmentCapacity(options.max_line_bytes)) {}

std::vector<OutputLine> LineAssembler::Feed(std::string_view bytes, TimePoint now) {
  std::vector<OutputLine> out;
  std::size_t i = 0;
  if (cr_deferred_ && !bytes.empty()) {
    cr_deferred_ = false;
    if (bytes[0] == '\n') {
      EndLine(/*at_eof=*/false, now, out);
      i = 1;
    } else {
      EndProgressSegment(now, out);
    }
  }
  while (i < bytes.size()) {
    auto const pos = bytes.find_first_of("\r\n", i);
    if (pos == std::string_view::npos) {
      Append(bytes.substr(i));
      break;
    }
    Append(bytes.substr(i, pos - i));
    i = pos + 1;
    if (bytes[pos] == '\n') {
      EndLine(/*at_eof=*/false, now, out);
    } else if (i == bytes.size()) {
      cr_deferred_ = true;
    } else if (bytes[i] == '\n') {
      EndLine(/*at_eof=*/false, now, out);
      ++i;
    } else {
      EndProgressSegment(now, out);
    }
  }
  // Checked last: anything newer in this chunk supersedes the waiting update.
  EmitPendingIfDue(now, out);
  return out;
}

std::vector<OutputLine> LineAssembler::Tick(TimePoint now) {
  std::vector<OutputLine> out;
  EmitPendingIfDue(now, out);
  return out;
}

std::vector<OutputLine> LineAssembler::Flush(TimePoint now) {
  std::vector<OutputLine> out;
  if (cr_deferred_) {
    cr_deferred_ = false;
    EndProgressSegment(now, out);
  }
  EndLine(/*at_eof=*/true, now, out);
  return out;
}

std::optional<LineAssembler::TimePoint> LineAssembler::NextDeadline() const {
  if (!pending_ || !last_progress_emit_) return std::nullopt;
  return *last_progress_emit_ + options_.progress_interval;
}

std::size_t LineAssembler::buffered_bytes() const {
  return segment_.size() + (pending_ ? pending_->text.size() : 0);
}

void LineAssembler::Append(std::string_view bytes) {
  auto const room = segment_capacity_ - segment_.size();
  auto const kept = std::min(room, bytes.size());
  segment_.append(bytes.substr(0, kept));
  segment_discarded_ += bytes.size() - kept;
}

OutputLine LineAssembler::TakeSegment(bool progress) {
  OutputLine line;
  line.progress = progress;
  auto const total = segment_.size() + segment_discarded_;
  auto keep = segment_.size();
  if (total > options_.max_line_bytes) {
    keep = Utf8SafePrefixLength(segment_, options_.max_line_bytes);
    line.truncated_bytes = total - keep;
  }
  // Copy rather than move so segment_ keeps its buffer for the next line.
  line.text.assign(segment_, 0, keep);
  segment_.clear();
  segment_discarded_ = 0;
  return line;
}

void LineAssembler::EndProgressSegment(TimePoint now, std::vector<OutputLine>& out) {
  if (segment_.empty() && segment_discarded_ == 0) return;
  auto line = TakeSegment(/*progress=*/true);
  if (pending_) {
    ++counters_.progress_suppressed;
    pending_.reset();
  }
  if (ProgressDue(now)) {
    EmitProgress(std::move(line), now, out);
  } else {
    pending_ = std::move(line);
  }
}

void LineAssembler::EndLine(bool at_eof, TimePoint now, std::vector<OutputLine>& out) {
  bool const has_text = !segment_.empty() || segment_discarded_ != 0;
  bool const redrawn = last_progress_emit_.has_value();
  if (has_text || (!redrawn && !at_eof)) {
    if (pending_) {
      ++counters_.progress_suppressed;
      pending_.reset();
    }
    EmitLine(TakeSegment(/*progress=*/false), out);
  } else if (pending_) {
    // An empty final segment shows nothing newer, so the waiting update is
    // the line's final state.
    auto line = std::move(*pending_);
    pending_.reset();
    EmitProgress(std::move(line), now, out);
  }
  last_progress_emit_.reset();
}

bool LineAssembler::ProgressDue(TimePoint now) const {
  return !last_progress_emit_ || now - *last_progress_emit_ >= options_.progress_interval;
}

void LineAssembler::EmitProgress(OutputLine line, TimePoint now,
                                 std::vector<OutputLine>& out) {
  ++counters_.progress_emitted;
  counters_.bytes_truncated += line.truncated_bytes;
  last_progress_emit_ = now;
  out.push_back(std::move(line));
}

void LineAssembler::EmitLine(OutputLine line, std::vector<OutputLine>& out) {
  ++counters_.lines_emitted;
  counters_.bytes_truncated += line.truncated_bytes;
  out.push_back(std::move(line));
}

void LineAssembler::EmitPendingIfDue(TimePoint now, std::vector<OutputLine>& out) {
  if (!pending_ || !ProgressDue(now)) return;
  auto line = std::move(*pending_);
  pending_.reset();
  EmitProgress(std::move(line), now, out);
}

}  // namespace spotvisor::output
