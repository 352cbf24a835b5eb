// etcd's JSON gateway answers (issue #16): every parser of the etcd client,
// and the gang coordinator's parsers of what other members wrote, on any
// bytes give a value or an error, never a crash, a hang or an exception; a
// member or generation record accepted once reads back as itself; the watch
// stream's frame splitter yields the same frames whichever way the bytes are
// cut into chunks, and never buffers past its bound.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "gang/etcd_client.h"
#include "gang/gang.h"

using namespace spotvisor::etcd_internal;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  (void)ParseRange(body);
  (void)ParsePut(body);
  (void)ParseDelete(body);
  (void)ParseTxn(body);
  (void)ParseLeaseGrant(body);
  (void)ParseLeaseKeepAlive(body);
  (void)ParseLeaseTimeToLive(body);
  (void)ParseAuthenticate(body);
  (void)ParseError(size % 600, body);
  (void)ParseWatchFrame(body);
  if (auto m = spotvisor::ParseMember(body); m.ok()) {
    auto again = spotvisor::ParseMember(spotvisor::MemberJson(*m));
    if (!again.ok() || !(*again == *m)) std::abort();
  }
  if (auto g = spotvisor::ParseGeneration(body); g.ok()) {
    auto again = spotvisor::ParseGeneration(spotvisor::GenerationJson(*g));
    if (!again.ok() || !(*again == *g)) std::abort();
  }
  if (auto e = spotvisor::ParseEnd(body); e.ok()) (void)spotvisor::ParseEnd(spotvisor::EndJson(*e));
  if (auto n = ParseInt64(body)) {
    if (ParseInt64(std::to_string(*n)) != n) std::abort();  // what it reads, it reads back
  }
  // The same stream fed whole and in two pieces cut anywhere: the same frames.
  constexpr std::size_t kMax = 512;
  auto frames = [&](std::size_t cut, bool& ok) {
    FrameSplitter s(kMax);
    std::vector<std::string> out;
    auto keep = [&](std::string_view f) {
      out.emplace_back(f);
      return true;
    };
    ok = s.Feed(body.substr(0, cut), keep) && s.Feed(body.substr(cut), keep);
    if (s.buffered() > kMax + size) std::abort();
    return out;
  };
  bool ok_whole = false, ok_cut = false;
  auto whole = frames(size, ok_whole);
  auto cut = frames(size / 3, ok_cut);
  if (ok_whole && ok_cut && whole != cut) std::abort();
  for (auto const& f : whole) {
    if (f.size() > kMax) std::abort();
    (void)ParseWatchFrame(f);
  }
  return 0;
}
