#include "output/utf8.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace spotvisor::output {
namespace {

// Independent of the implementation's range table: decode the code point
// arithmetically and reject overlongs, surrogates and values past U+10FFFF.
bool ReferenceValid(std::string const& s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto const c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      n = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      auto const cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    std::uint32_t const min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// Inverse of the escaping, valid for inputs that contain no backslash.
std::string Unescape(std::string const& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] == 'x') {
      out += static_cast<char>(std::stoi(s.substr(i + 2, 2), nullptr, 16));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

TEST_CASE("valid UTF-8 is returned unchanged", "[utf8]") {
  std::vector<std::string> const inputs = {
      "",
      "plain ascii, with \\x41 literal",
      std::string("nul\0inside", 10),
      "日本語",
      "\xF0\x9F\x98\x80 emoji \xF0\x9F\x9A\x80",
      "\xC2\x80",          // U+0080, smallest 2-byte
      "\xDF\xBF",          // U+07FF
      "\xE0\xA0\x80",      // U+0800, smallest 3-byte
      "\xED\x9F\xBF",      // U+D7FF, just below the surrogates
      "\xEE\x80\x80",      // U+E000, just above them
      "\xEF\xBF\xBF",      // U+FFFF
      "\xF0\x90\x80\x80",  // U+10000, smallest 4-byte
      "\xF4\x8F\xBF\xBF",  // U+10FFFF, the largest code point
  };
  for (auto const& s : inputs) {
    INFO(s);
    CHECK(IsValidUtf8(s));
    CHECK(ReferenceValid(s));
    CHECK(EscapeInvalidUtf8(s) == s);
  }
}

TEST_CASE("each class of invalid byte is escaped", "[utf8]") {
  struct Case {
    std::string input;
    std::string expected;
  };
  std::vector<Case> const cases = {
      // Overlong encodings.
      {"\xC0\x80", "\\xc0\\x80"},
      {"\xC1\xBF", "\\xc1\\xbf"},
      {"\xE0\x80\x80", "\\xe0\\x80\\x80"},
      {"\xE0\x9F\xBF", "\\xe0\\x9f\\xbf"},
      {"\xF0\x80\x80\x80", "\\xf0\\x80\\x80\\x80"},
      {"\xF0\x8F\xBF\xBF", "\\xf0\\x8f\\xbf\\xbf"},
      // Surrogates.
      {"\xED\xA0\x80", "\\xed\\xa0\\x80"},
      {"\xED\xBF\xBF", "\\xed\\xbf\\xbf"},
      // Beyond U+10FFFF.
      {"\xF4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"},
      {"\xF5\x80\x80\x80", "\\xf5\\x80\\x80\\x80"},
      {"\xFE\xFF", "\\xfe\\xff"},
      // Truncated sequences, at the end and followed by other text.
      {"ab\xE6\x97", "ab\\xe6\\x97"},
      {"\xE6\x97" "A", "\\xe6\\x97A"},
      {"\xF0\x9F\x98", "\\xf0\\x9f\\x98"},
      {"\xC3", "\\xc3"},
      // Stray continuation bytes.
      {"\x80", "\\x80"},
      {"a\xBF" "b", "a\\xbfb"},
      {"\xE6\x97\xA5\xA5", "\xE6\x97\xA5\\xa5"},
      // A valid sequence right after an ill-formed lead survives intact.
      {"\xE6\xE6\x97\xA5", "\\xe6\xE6\x97\xA5"},
      {"\xF0\xF0\x9F\x98\x80!", "\\xf0\xF0\x9F\x98\x80!"},
  };
  for (auto const& c : cases) {
    INFO(c.expected);
    CHECK_FALSE(IsValidUtf8(c.input));
    CHECK_FALSE(ReferenceValid(c.input));
    auto const escaped = EscapeInvalidUtf8(c.input);
    CHECK(escaped == c.expected);
    CHECK(IsValidUtf8(escaped));
  }
}

TEST_CASE("escaping random bytes always yields valid UTF-8", "[utf8]") {
  std::mt19937 rng(20240601);
  // Mostly bytes that form or nearly form multi-byte sequences, so the edges
  // of every range get hit, not just ASCII and stray continuations.
  std::vector<unsigned char> const interesting = {
      0x00, 'a',  0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2,
      0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF};
  std::uniform_int_distribution<int> length(0, 24);
  std::uniform_int_distribution<int> any_byte(0, 255);
  std::uniform_int_distribution<std::size_t> pick(0, interesting.size() - 1);
  std::bernoulli_distribution use_interesting(0.8);
  int const kIterations = 50000;
  int valid_inputs = 0;
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    std::string s;
    for (int n = length(rng); n > 0; --n) {
      auto b = use_interesting(rng) ? interesting[pick(rng)]
                                    : static_cast<unsigned char>(any_byte(rng));
      if (b == '\\') b = '/';  // Keeps Unescape unambiguous.
      s += static_cast<char>(b);
    }
    bool const valid = ReferenceValid(s);
    valid_inputs += valid ? 1 : 0;
    REQUIRE(IsValidUtf8(s) == valid);
    auto const escaped = EscapeInvalidUtf8(s);
    REQUIRE(ReferenceValid(escaped));
    REQUIRE((escaped == s) == valid);
    REQUIRE(Unescape(escaped) == s);
  }
  // Guards the generator: both outcomes must be well represented.
  CHECK(valid_inputs > kIterations / 40);
  CHECK(valid_inputs < kIterations - kIterations / 40);
}

TEST_CASE("safe prefix never splits a sequence", "[utf8]") {
  std::string const s = "a日\xF0\x9F\x98\x80z";  // 1 + 3 + 4 + 1 bytes
  std::vector<std::size_t> const expected = {0, 1, 1, 1, 4, 4, 4, 4, 8, 9, 9, 9};
  for (std::size_t n = 0; n < expected.size(); ++n) {
    INFO("n=" << n);
    CHECK(Utf8SafePrefixLength(s, n) == expected[n]);
  }
}

TEST_CASE("safe prefix ignores ill-formed bytes", "[utf8]") {
  // A truncated lead or an overlong is not a sequence, so cutting after it
  // splits nothing.
  CHECK(Utf8SafePrefixLength("\xE6" "AB", 1) == 1);
  CHECK(Utf8SafePrefixLength("\xE6\x97" "B", 2) == 2);
  CHECK(Utf8SafePrefixLength("\xC0\x80", 1) == 1);
  CHECK(Utf8SafePrefixLength("\xED\xA0\x80", 2) == 2);
  CHECK(Utf8SafePrefixLength("\x80\x80\x80\x80\x80", 4) == 4);
  CHECK(Utf8SafePrefixLength("", 3) == 0);
}

TEST_CASE("safe prefix agrees with validity on random text", "[utf8]") {
  std::mt19937 rng(7);
  std::vector<std::string> const pieces = {"a", "日", "\xF0\x9F\x98\x80", "\xC3\xA9", "\x80",
                                           "\xE6"};
  std::uniform_int_distribution<std::size_t> pick(0, pieces.size() - 1);
  for (int iteration = 0; iteration < 2000; ++iteration) {
    std::string s;
    for (int k = 0; k < 8; ++k) s += pieces[pick(rng)];
    for (std::size_t n = 0; n <= s.size() + 1; ++n) {
      auto const k = Utf8SafePrefixLength(s, n);
      REQUIRE(k <= std::min(n, s.size()));
      // Escaping the prefix must not turn a valid character of s into escapes,
      // i.e. the prefix's escaped form is a prefix of the whole's.
      auto const whole = EscapeInvalidUtf8(s);
      auto const part = EscapeInvalidUtf8(s.substr(0, k));
      REQUIRE(whole.compare(0, part.size(), part) == 0);
      // And it is the largest such cut.
      if (k < std::min(n, s.size())) {
        auto const next = EscapeInvalidUtf8(s.substr(0, k + 1));
        REQUIRE(whole.compare(0, next.size(), next) != 0);
      }
    }
  }
}

}  // namespace
}  // namespace spotvisor::output
