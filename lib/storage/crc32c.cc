#include "storage/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

namespace spotvisor {
namespace internal {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78;  // reflected Castagnoli polynomial

constexpr std::array<std::uint32_t, 256> MakeTable() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kTable = MakeTable();

}  // namespace

std::uint32_t Crc32cExtendTable(std::uint32_t crc, std::string_view data) {
  crc = ~crc;
  for (unsigned char b : data) crc = kTable[(crc ^ b) & 0xff] ^ (crc >> 8);
  return ~crc;
}

namespace {

// The CRC register (not inverted) after `zeros` zero bytes, as a linear map
// of the register before them: four byte tables, one per byte of the input
// register (a 32x32 matrix over GF(2), applied a byte at a time).
struct ZerosOperator {
  std::array<std::array<std::uint32_t, 256>, 4> t{};
  std::uint32_t Apply(std::uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

ZerosOperator MakeZerosOperator(std::size_t zeros) {
  std::array<std::uint32_t, 32> column{};
  for (int bit = 0; bit < 32; ++bit) {
    std::uint32_t c = 1u << bit;
    for (std::size_t i = 0; i < zeros; ++i) c = kTable[c & 0xff] ^ (c >> 8);
    column[bit] = c;
  }
  ZerosOperator op;
  for (int byte = 0; byte < 4; ++byte) {
    for (std::uint32_t v = 0; v < 256; ++v) {
      std::uint32_t out = 0;
      for (int b = 0; b < 8; ++b) {
        if ((v >> b) & 1) out ^= column[byte * 8 + b];
      }
      op.t[byte][v] = out;
    }
  }
  return op;
}

// GF(2) 32x32 matrices as 32 columns, for Crc32cCombine's any-length shift
// (zlib's crc32_combine method: square the one-zero-bit operator).
using Matrix = std::array<std::uint32_t, 32>;
std::uint32_t Times(const Matrix& m, std::uint32_t v) {
  std::uint32_t out = 0;
  for (int i = 0; v != 0; ++i, v >>= 1) {
    if (v & 1) out ^= m[i];
  }
  return out;
}
Matrix Square(const Matrix& m) {
  Matrix out{};
  for (int i = 0; i < 32; ++i) out[i] = Times(m, m[i]);
  return out;
}

// Lanes of the interleaved loop: three of kLane bytes each per step.
constexpr std::size_t kLane = 4096;

}  // namespace

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t Crc32cExtendSse42(std::uint32_t crc, std::string_view data) {
  std::uint64_t c = ~crc;
  const char* p = data.data();
  std::size_t n = data.size();
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; ++p, --n) c32 = _mm_crc32_u8(c32, static_cast<unsigned char>(*p));
  return ~c32;
}

// The crc32 instruction has a latency of three cycles and a throughput of
// one: a single chain waits on itself. Three independent chains over three
// adjacent lanes keep the unit busy; their registers are then joined by
// shifting over the lanes that follow (a table lookup per byte).
__attribute__((target("sse4.2"))) std::uint32_t Crc32cExtendSse42x3(std::uint32_t crc, std::string_view data) {
  static const ZerosOperator kShiftLane = MakeZerosOperator(kLane);
  std::uint64_t c = ~crc;
  const char* p = data.data();
  std::size_t n = data.size();
  for (; n >= 3 * kLane; p += 3 * kLane, n -= 3 * kLane) {
    std::uint64_t c0 = c, c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < kLane; i += 8) {
      std::uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p + kLane + i, 8);
      std::memcpy(&v2, p + 2 * kLane + i, 8);
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    auto joined = kShiftLane.Apply(kShiftLane.Apply(static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1)) ^
                  static_cast<std::uint32_t>(c2);
    c = joined;
  }
  return Crc32cExtendSse42(~static_cast<std::uint32_t>(c), std::string_view(p, n));
}

bool CpuHasSse42() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_2) != 0;
}
#else
std::uint32_t Crc32cExtendSse42(std::uint32_t crc, std::string_view data) { return Crc32cExtendTable(crc, data); }
std::uint32_t Crc32cExtendSse42x3(std::uint32_t crc, std::string_view data) { return Crc32cExtendTable(crc, data); }
bool CpuHasSse42() { return false; }
#endif

}  // namespace internal

namespace {
const bool kHardware = internal::CpuHasSse42();
}

std::uint32_t Crc32cExtend(std::uint32_t crc, std::string_view data) {
  return kHardware ? internal::Crc32cExtendSse42x3(crc, data) : internal::Crc32cExtendTable(crc, data);
}

const char* Crc32cImplementation() { return kHardware ? "sse4.2, 3 chains" : "table"; }

std::uint32_t Crc32cCombine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) {
  // crc(A || B) = crc(A) shifted over |B| zero bytes, xor crc(B): the pre-
  // and post-inversions cancel (the method of zlib's crc32_combine). The
  // shift squares the one-zero-bit operator up to each set bit of |B|.
  if (len_b == 0) return crc_a;
  internal::Matrix odd{};  // the operator for one zero bit
  odd[0] = 0x82F63B78;
  for (int i = 1; i < 32; ++i) odd[i] = 1u << (i - 1);
  internal::Matrix even = internal::Square(odd);  // two zero bits
  odd = internal::Square(even);                   // four zero bits
  std::uint32_t a = crc_a;
  do {
    even = internal::Square(odd);
    if (len_b & 1) a = internal::Times(even, a);
    len_b >>= 1;
    if (len_b == 0) break;
    odd = internal::Square(even);
    if (len_b & 1) a = internal::Times(odd, a);
    len_b >>= 1;
  } while (len_b != 0);
  return a ^ crc_b;
}

std::string Base64Encode(std::string_view in) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    std::uint32_t v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8) |
                      static_cast<unsigned char>(in[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (std::size_t rest = in.size() - i; rest > 0) {
    std::uint32_t v = static_cast<unsigned char>(in[i]) << 16;
    if (rest == 2) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

StatusOr<std::string> Base64Decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (in.size() % 4 != 0) return InvalidArgumentError("base64 length is not a multiple of 4");
  std::string out;
  for (std::size_t i = 0; i < in.size(); i += 4) {
    int pad = (in[i + 3] == '=') + (in[i + 2] == '=' && in[i + 3] == '=');
    if (pad > 0 && i + 4 != in.size()) return InvalidArgumentError("base64 padding before the end");
    std::uint32_t v = 0;
    for (int k = 0; k < 4 - pad; ++k) {
      int d = value(in[i + k]);
      if (d < 0) return InvalidArgumentError("invalid base64 character");
      v |= static_cast<std::uint32_t>(d) << (18 - 6 * k);
    }
    out += static_cast<char>(v >> 16);
    if (pad < 2) out += static_cast<char>(v >> 8);
    if (pad < 1) out += static_cast<char>(v);
  }
  return out;
}

StatusOr<std::uint32_t> Crc32cFromBase64(std::string_view text) {
  auto bytes = Base64Decode(text);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() != 4) return InvalidArgumentError("a crc32c is 4 bytes");
  auto b = [&](int i) { return static_cast<std::uint32_t>(static_cast<unsigned char>((*bytes)[i])); };
  return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

std::string Crc32cToBase64(std::uint32_t crc) {
  char be[4] = {static_cast<char>(crc >> 24), static_cast<char>(crc >> 16), static_cast<char>(crc >> 8),
                static_cast<char>(crc)};
  return Base64Encode(std::string_view(be, 4));
}

}  // namespace spotvisor
