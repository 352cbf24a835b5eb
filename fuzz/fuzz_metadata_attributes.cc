// What the metadata server answers for instance/attributes/?recursive=true:
// ParseAttributes on any bytes, then the attributes as the instance metadata
// layer of ResolveConfig. Never a throw, never a crash on deep nesting.
//
// The watcher itself parses nothing: it compares the value it is given as
// bytes and passes the ETag back, percent-encoded (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "config/config.h"
#include "metadata/metadata_client.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  auto attrs = spotvisor::ParseAttributes(body, "metadata instance/attributes/");
  if (!attrs.ok()) {
    if (attrs.status().code() != spotvisor::StatusCode::kFailedPrecondition) std::abort();
    return 0;
  }
  spotvisor::ConfigInputs in;
  in.file_path = "fuzz.conf";
  in.instance_attributes = *std::move(attrs);
  in.dynamic_defaults = {{"user", "root"}, {"run-id", "fuzz"}, {"on-exit", "none"}};
  auto r = spotvisor::ResolveConfig(in);
  if (r.config.has_value() != r.errors.empty()) std::abort();
  return 0;
}
