// LineAssembler on any bytes, cut into chunks arriving at increasing times.
// Checked: the documented promise that where the splits fall never changes
// the result (the same input fed byte by byte, at the same times, with a Tick
// at each NextDeadline(), gives the same lines and counters), lines within
// max_line_bytes, buffers bounded.
//
// Input: byte 0 picks max_line_bytes (1-64, small so truncation is reached),
// byte 1 the progress interval; then chunks, each a control byte (length
// 0-31, time step 0-700 ms, whether to Tick after it) and its bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "output/line_assembler.h"

namespace {

using spotvisor::output::LineAssembler;
using spotvisor::output::OutputLine;

struct Chunk {
  std::string_view bytes;
  LineAssembler::TimePoint at;
  bool tick;
};

void Check(const std::vector<OutputLine>& lines, std::size_t max) {
  for (auto const& l : lines) {
    if (l.text.size() > max) std::abort();
  }
}

std::vector<OutputLine> Run(const std::vector<Chunk>& chunks, spotvisor::output::LineAssemblerOptions o, bool bytewise,
                            spotvisor::output::LineAssemblerCounters& counters) {
  LineAssembler a(o);
  std::vector<OutputLine> out;
  auto add = [&](std::vector<OutputLine> v) {
    Check(v, o.max_line_bytes);
    out.insert(out.end(), v.begin(), v.end());
    if (a.buffered_bytes() > 2 * o.max_line_bytes + 8) std::abort();
  };
  LineAssembler::TimePoint last{};
  for (auto const& c : chunks) {
    // The owner's contract: a timer on NextDeadline() Ticks when it is due.
    // A chunk that arrives after a missed deadline may or may not supersede
    // the waiting update depending on where it is cut (line_assembler.h).
    if (auto d = a.NextDeadline(); d && *d <= c.at) add(a.Tick(*d));
    if (bytewise) {
      for (std::size_t i = 0; i < c.bytes.size(); ++i) add(a.Feed(c.bytes.substr(i, 1), c.at));
    } else {
      add(a.Feed(c.bytes, c.at));
    }
    if (c.tick) add(a.Tick(c.at));
    last = c.at;
  }
  add(a.Flush(last));
  counters = a.counters();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  spotvisor::output::LineAssemblerOptions o;
  o.max_line_bytes = 1 + data[0] % 64;
  o.progress_interval = std::chrono::milliseconds(data[1] * 10);
  std::vector<Chunk> chunks;
  LineAssembler::TimePoint now{};
  std::size_t i = 2;
  while (i < size) {
    std::uint8_t c = data[i++];
    std::size_t len = std::min<std::size_t>(c & 31, size - i);
    now += std::chrono::milliseconds(((c >> 5) & 3) * 233);
    chunks.push_back({std::string_view(reinterpret_cast<const char*>(data + i), len), now, (c & 0x80) != 0});
    i += len;
  }
  spotvisor::output::LineAssemblerCounters whole, bytewise;
  auto a = Run(chunks, o, false, whole);
  auto b = Run(chunks, o, true, bytewise);
  if (a != b || !(whole == bytewise)) std::abort();
  return 0;
}
