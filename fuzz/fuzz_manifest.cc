// ParseManifest: any bytes give a manifest or an error, never a throw; an
// accepted manifest only names safe relative paths and objects under
// checkpoints/, each path once, and its messages are valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "output/utf8.h"
#include "sync/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto m = spotvisor::ParseManifest(text, "gs://b/run/manifest.json", "/ckpt");
  if (!m.ok()) {
    if (!spotvisor::output::IsValidUtf8(m.status().message())) std::abort();
    return 0;
  }
  std::set<std::string> seen;
  for (auto const& f : m->files) {
    if (!spotvisor::IsSafeRelativePath(f.path) || f.object.rfind(spotvisor::kObjectsDir, 0) != 0) std::abort();
    if (!seen.insert(f.path).second || f.path == spotvisor::kCompleteMarker) std::abort();
  }
  if (m->sequence < 0) std::abort();
  return 0;
}
