#include "storage/crc32c.h"

#include <catch2/catch.hpp>
#include <random>

namespace spotvisor {
namespace {

TEST_CASE("crc32c known answers (RFC 3720 B.4 and the GCS docs)") {
  CHECK(Crc32c("") == 0);
  CHECK(Crc32c("123456789") == 0xE3069283);
  CHECK(Crc32c(std::string(32, '\0')) == 0x8A9136AA);
  CHECK(Crc32c(std::string(32, '\xff')) == 0x62A8AB43);
  // gsutil hash of "hello world" is crc32c=yZRlqg==.
  CHECK(Crc32cToBase64(Crc32c("hello world")) == "yZRlqg==");
}

TEST_CASE("hardware and table implementations agree, and extending equals hashing at once") {
  std::mt19937 rng(1);
  for (int len : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4097}) {
    std::string s(static_cast<std::size_t>(len), '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    auto whole = internal::Crc32cExtendTable(0, s);
    if (internal::CpuHasSse42()) CHECK(internal::Crc32cExtendSse42(0, s) == whole);
    for (std::size_t cut = 0; cut <= s.size(); cut += 13) {
      CHECK(Crc32cExtend(Crc32cExtend(0, std::string_view(s).substr(0, cut)), std::string_view(s).substr(cut)) == whole);
    }
  }
}

TEST_CASE("three interleaved chains agree with one, across block edges and from any starting crc") {
  if (!internal::CpuHasSse42()) return;
  std::mt19937 rng(2);
  for (std::size_t len : {std::size_t{0}, std::size_t{12287}, std::size_t{12288}, std::size_t{12289},
                          std::size_t{12288 * 2 + 7}, std::size_t{100000}, std::size_t{1} << 20}) {
    std::string s(len, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    for (std::uint32_t start : {0u, 0xE3069283u, static_cast<std::uint32_t>(rng())}) {
      auto expected = internal::Crc32cExtendTable(start, s);
      CHECK(internal::Crc32cExtendSse42x3(start, s) == expected);
      CHECK(internal::Crc32cExtendSse42(start, s) == expected);
    }
  }
  CHECK(std::string(Crc32cImplementation()) == "sse4.2, 3 chains");
}

TEST_CASE("combining two parts' crc32c gives the whole's") {
  std::mt19937 rng(3);
  std::string s(70000, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  auto whole = Crc32c(s);
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{33333}, s.size()}) {
    auto a = std::string_view(s).substr(0, cut), b = std::string_view(s).substr(cut);
    CHECK(Crc32cCombine(Crc32c(a), Crc32c(b), b.size()) == whole);
  }
  CHECK(Crc32cCombine(Crc32c("1234"), Crc32c("56789"), 5) == 0xE3069283);
}

TEST_CASE("base64") {
  CHECK(Base64Encode("") == "");
  CHECK(Base64Encode("f") == "Zg==");
  CHECK(Base64Encode("fo") == "Zm8=");
  CHECK(Base64Encode("foo") == "Zm9v");
  CHECK(Base64Encode("foobar") == "Zm9vYmFy");
  for (auto const& s : std::vector<std::string>{"", "f", "fo", "foo", "foobar", std::string("\0\xff\x10", 3)}) {
    CHECK(*Base64Decode(Base64Encode(s)) == s);
  }
  CHECK_FALSE(Base64Decode("Zm9").ok());
  CHECK_FALSE(Base64Decode("Zm=v").ok());
  CHECK_FALSE(Base64Decode("Z!9v").ok());
  CHECK(*Crc32cFromBase64("yZRlqg==") == Crc32c("hello world"));
  CHECK_FALSE(Crc32cFromBase64("Zm9vYmFy").ok());
}

}  // namespace
}  // namespace spotvisor
