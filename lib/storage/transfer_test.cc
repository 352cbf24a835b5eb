#include "storage/transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "storage/crc32c.h"

namespace spotvisor {
namespace {

struct TempFile {
  std::string path;
  TempFile() {
    char tmpl[] = "/tmp/spotvisor-transfer-test-XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    path = tmpl;
  }
  ~TempFile() { unlink(path.c_str()); }
  std::string Read() const {
    std::string out;
    Fd f{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    REQUIRE(f.fd >= 0);
    char buf[1 << 16];
    for (ssize_t n; (n = read(f.fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    return out;
  }
  std::uint64_t Size() const {
    struct stat st {};
    REQUIRE(stat(path.c_str(), &st) == 0);
    return static_cast<std::uint64_t>(st.st_size);
  }
};

std::string Pattern(std::size_t n, unsigned seed) {
  std::string s(n, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& c : s) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

// Cuts `data` into pieces of the odd sizes libcurl might hand over.
std::vector<std::string_view> Pieces(std::string_view data) {
  static const std::size_t sizes[] = {1, 7, 256 << 10, 300 << 10, 4095, 65537, 1 << 20};
  std::vector<std::string_view> out;
  for (std::size_t i = 0; !data.empty(); ++i) {
    std::size_t n = std::min(sizes[i % std::size(sizes)], data.size());
    out.push_back(data.substr(0, n));
    data.remove_prefix(n);
  }
  return out;
}

TEST_CASE("a download's pieces reach the file in whole blocks, byte for byte") {
  TempFile t;
  Fd f{open(t.path.c_str(), O_WRONLY | O_CLOEXEC)};
  REQUIRE(f.fd >= 0);
  const std::string data = Pattern((5 << 19) + 3, 1);  // 2.5 MiB + 3
  BlockWriter w(f.fd, 0, t.path, 0);                    // size unknown: 1 MiB blocks
  for (auto piece : Pieces(data)) REQUIRE(w.Write(piece).ok());
  // Only whole blocks are written before the last one is flushed.
  CHECK(t.Size() == (2u << 20));
  REQUIRE(w.Flush().ok());
  CHECK(t.Size() == data.size());
  CHECK(t.Read() == data);
  CHECK(w.Flush().ok());  // nothing left: a no-op
  CHECK(t.Read() == data);
}

TEST_CASE("a small download's block is no bigger than the download") {
  TempFile t;
  Fd f{open(t.path.c_str(), O_WRONLY | O_CLOEXEC)};
  REQUIRE(f.fd >= 0);
  const std::string data = Pattern(70 << 10, 2);
  BlockWriter w(f.fd, 0, t.path, data.size());
  REQUIRE(w.Write(data).ok());
  CHECK(t.Size() == data.size());  // the block filled exactly: written at once
  CHECK(t.Read() == data);
}

TEST_CASE("the ranges of one file, written at once from four threads, come out whole") {
  TempFile t;
  const std::size_t range = (9 << 20) + 5, n = 4;
  const std::string data = Pattern(range * n, 3);
  auto created = CreateForRanges(t.path, data.size());
  REQUIRE(created.ok());
  Fd f{*created};
  std::mutex file_mu;
  std::atomic<std::int64_t> moved{0};
  CallContext ctx;
  ctx.on_bytes = [&moved](std::int64_t k) { moved += k; };
  const std::string what = "gs://b/o";
  std::vector<std::uint32_t> crcs(n);
  std::vector<std::uint64_t> counted(n, 0);
  std::vector<int> ok(n, 0);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      RangeWriter r{f.fd, i * range, range, t.path, what, ctx, counted[i], &file_mu};
      bool all = true;
      for (auto piece : Pieces(std::string_view(data).substr(i * range, range))) all = all && r.Feed(piece);
      ok[i] = all && r.error.ok() && r.got == range;
      crcs[i] = r.crc;
    });
  }
  for (auto& th : threads) th.join();
  for (std::size_t i = 0; i < n; ++i) {
    INFO(i);
    CHECK(ok[i]);
    CHECK(counted[i] == range);
    CHECK(crcs[i] == Crc32c(std::string_view(data).substr(i * range, range)));
  }
  CHECK(moved.load() == static_cast<std::int64_t>(data.size()));
  // The last byte of each range flushed its block: nothing is left behind.
  CHECK(t.Read() == data);
}

TEST_CASE("a range that gets more bytes than it asked for stops the transfer") {
  TempFile t;
  Fd f{open(t.path.c_str(), O_WRONLY | O_CLOEXEC)};
  REQUIRE(f.fd >= 0);
  CallContext ctx;
  std::uint64_t counted = 0;
  const std::string what = "gs://b/o";
  RangeWriter r{f.fd, 0, 10, t.path, what, ctx, counted};
  CHECK(r.Feed("0123456"));
  CHECK_FALSE(r.Feed("789ab"));
  CHECK(r.error.code() == StatusCode::kUnavailable);
  CHECK_THAT(r.error.message(), Catch::Contains("more bytes than the range asked for"));
}

TEST_CASE("a whole download is written when it finishes, with its crc32c and size") {
  TempFile t;
  Fd f{open(t.path.c_str(), O_WRONLY | O_CLOEXEC)};
  REQUIRE(f.fd >= 0);
  const std::string data = Pattern((3 << 20) + 11, 4);
  CallContext ctx;
  std::int64_t moved = 0;
  ctx.on_bytes = [&moved](std::int64_t k) { moved += k; };
  std::uint64_t counted = 0;
  FileWriter w(f.fd, t.path, data.size(), ctx, counted);
  for (auto piece : Pieces(data)) REQUIRE(w.Feed(piece));
  REQUIRE(w.Finish().ok());
  CHECK(t.Read() == data);
  CHECK(w.size == data.size());
  CHECK(w.crc == Crc32c(data));
  CHECK(counted == data.size());
  CHECK(moved == static_cast<std::int64_t>(data.size()));
}

TEST_CASE("a full disk stops a download as the user's to fix, not the network's") {
  Fd f{open("/dev/full", O_WRONLY | O_CLOEXEC)};
  REQUIRE(f.fd >= 0);
  const std::string path = "/dev/full";
  const std::string data = Pattern(300 << 10, 5);
  SECTION("a block that fills up is written at once and fails") {
    CallContext ctx;
    std::uint64_t counted = 0;
    FileWriter w(f.fd, path, 64 << 10, ctx, counted);  // 64 KiB blocks
    CHECK_FALSE(w.Feed(data));
    CHECK(w.error.code() == StatusCode::kFailedPrecondition);
  }
  SECTION("the last block fails when it is flushed") {
    BlockWriter w(f.fd, 0, path, 0);
    REQUIRE(w.Write("tail").ok());
    auto s = w.Flush();
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(s.message(), Catch::Contains("/dev/full"));
  }
}

}  // namespace
}  // namespace spotvisor
