#include "output/utf8.h"

namespace spotvisor::output {
namespace {

constexpr std::size_t kMaxSequenceBytes = 4;
constexpr char kHex[] = "0123456789abcdef";

bool InRange(unsigned char c, unsigned char lo, unsigned char hi) {
  return c >= lo && c <= hi;
}

bool IsContinuation(unsigned char c) { return InRange(c, 0x80, 0xBF); }

// Length of the well-formed sequence starting s, or 0 when s does not start
// with one. The second-byte ranges are where overlongs, surrogates and values
// above U+10FFFF are excluded (Unicode Table 3-7).
std::size_t SequenceLength(std::string_view s) {
  if (s.empty()) return 0;
  auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char const lead = byte(0);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (InRange(lead, 0xC2, 0xDF)) {
    length = 2;
  } else if (InRange(lead, 0xE0, 0xEF)) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (InRange(lead, 0xF0, 0xF4)) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;  // C0, C1, F5..FF, or a stray continuation byte.
  }
  if (s.size() < length || !InRange(byte(1), lo, hi)) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (!IsContinuation(byte(i))) return 0;
  }
  return length;
}

// Offset of the first byte not covered by a well-formed sequence.
std::size_t ValidPrefixLength(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;  // Trainer output is mostly ASCII; skip the table for it.
      continue;
    }
    auto const n = SequenceLength(s.substr(i));
    if (n == 0) return i;
    i += n;
  }
  return i;
}

}  // namespace

bool IsValidUtf8(std::string_view s) { return ValidPrefixLength(s) == s.size(); }

std::string EscapeInvalidUtf8(std::string_view s) {
  auto valid = ValidPrefixLength(s);
  if (valid == s.size()) return std::string(s);

  std::string out;
  out.reserve(s.size() + 16);
  out.append(s.substr(0, valid));
  std::size_t i = valid;
  while (i < s.size()) {
    auto const n = SequenceLength(s.substr(i));
    if (n != 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // Escape one byte at a time: a valid sequence may start right after an
    // ill-formed lead byte, and it must survive intact.
    auto const c = static_cast<unsigned char>(s[i]);
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 0x0F];
    ++i;
  }
  return out;
}

std::size_t Utf8SafePrefixLength(std::string_view s, std::size_t n) {
  if (n >= s.size()) return s.size();
  // Only a sequence starting in the last few bytes before n can span the cut,
  // and only if every byte between its lead and the cut is a continuation.
  for (std::size_t back = 1; back < kMaxSequenceBytes && back <= n; ++back) {
    auto const start = n - back;
    auto const c = static_cast<unsigned char>(s[start]);
    if (IsContinuation(c)) continue;
    return SequenceLength(s.substr(start)) > back ? start : n;
  }
  return n;
}

}  // namespace spotvisor::output
