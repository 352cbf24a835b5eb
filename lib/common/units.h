// Sizes, rates and commands as messages show them: one style everywhere.
// Fields keep the raw numbers (bytes as integers, `_s` seconds, `_mbps`
// megabytes a second); a message says them with these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spotvisor {

// Decimal units, as gsutil and the consoles print them: "12 bytes",
// "340.0 kB", "1.2 GB".
std::string FormatBytes(std::uint64_t bytes);
// "45.2 MB/s", "16.1 kB/s", "0 bytes/s".
std::string FormatRate(double bytes_per_second);
// An argv as a person would type it in sh: words without special
// characters bare, the rest in single quotes ("python3 train.py --lr 0.1",
// "sh -c 'echo hi'"). For messages; what is exec'ed is the argv itself.
std::string ShellJoin(const std::vector<std::string>& argv);

}  // namespace spotvisor
