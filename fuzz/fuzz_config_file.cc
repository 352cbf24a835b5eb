// The config file, end to end: ParseConfigText on any bytes, then every
// entry through ResolveConfig (the file layer, where values meet duration,
// integer, path, command and bucket parsing). Never a throw; and a value
// read from a file, written back with QuoteConfigValue, reads back as itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "config/config.h"
#include "config/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto entries = spotvisor::ParseConfigText(text, "fuzz.conf");
  if (!entries.ok()) return 0;
  for (auto const& e : *entries) {
    auto back = spotvisor::ParseConfigText("k = " + spotvisor::QuoteConfigValue(e.value) + "\n", "quoted");
    if (!back.ok() || back->size() != 1 || (*back)[0].value != e.value) std::abort();
  }
  spotvisor::ConfigInputs in;
  in.file_path = "fuzz.conf";
  in.file_entries = *std::move(entries);
  in.dynamic_defaults = {{"user", "root"}, {"run-id", "fuzz"}, {"on-exit", "none"}};
  auto r = spotvisor::ResolveConfig(in);
  if (r.config.has_value() != r.errors.empty()) std::abort();
  return 0;
}
