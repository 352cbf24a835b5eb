#include "common/duration.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <system_error>

#include <fmt/format.h>

namespace spotvisor {
namespace {

struct Unit {
  std::string_view name;
  double ms;
};

// Longest names first so "ms" is not read as "m" followed by garbage.
constexpr Unit kUnits[] = {{"ms", 1}, {"s", 1000}, {"m", 60'000},
                           {"h", 3'600'000}, {"d", 86'400'000}};

// Errors quote what was written, but not all of a 1 MB value: the message
// ends up in a log entry.
std::string Shown(std::string_view text) {
  constexpr std::size_t kMax = 64;
  if (text.size() <= kMax) return std::string(text);
  return fmt::format("{}...({} bytes)", text.substr(0, kMax), text.size());
}

Status NotADuration(std::string_view text) {
  return InvalidArgumentError(fmt::format(
      "\"{}\" is not a duration (try 20s, 15m or 1h30m)", Shown(text)));
}

// Far beyond any sensible timeout (27 years), and small enough that a
// deadline of now + this, in nanoseconds, cannot overflow a clock's int64.
constexpr double kMaxMs = 10'000.0 * 86'400'000;

Status TooLong(std::string_view text) {
  return InvalidArgumentError(fmt::format("\"{}\" is too long a duration (at most 10000d)", Shown(text)));
}

}  // namespace

StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  if (text.empty()) return NotADuration(text);
  std::size_t i = 0;
  double total_ms = 0;
  bool any_unit = false;
  while (i < text.size()) {
    std::size_t start = i;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
    if (start == i) return NotADuration(text);
    std::string_view number = text.substr(start, i - start);
    if (number.find('.') != number.rfind('.') || number == ".") return NotADuration(text);
    // from_chars, not stod: no exception on "1e400"-sized input (400 digits
    // are out of a double's range), and no locale deciding what '.' means.
    double value = 0;
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value, std::chars_format::fixed);
    if (ec == std::errc::result_out_of_range) {
      // Too small to be anything but 0 (0.000...01s) is harmless; too large is not.
      if (number.find_first_of("123456789") < number.find('.')) return TooLong(text);
      value = 0;
    } else if (ec != std::errc() || end != number.data() + number.size()) {
      return NotADuration(text);
    }
    std::size_t unit_start = i;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
    std::string_view unit = text.substr(unit_start, i - unit_start);
    if (unit.empty()) {
      // A bare number means seconds, but only as the whole value: "1h30" is
      // more likely a typo than 1h and 30 seconds.
      if (any_unit || i != text.size()) return NotADuration(text);
      total_ms += value * 1000;
      break;
    }
    const Unit* found = nullptr;
    for (auto const& u : kUnits) {
      if (u.name == unit) found = &u;
    }
    if (found == nullptr) return NotADuration(text);
    total_ms += value * found->ms;
    any_unit = true;
  }
  if (!std::isfinite(total_ms) || total_ms > kMaxMs) return TooLong(text);
  return std::chrono::milliseconds(static_cast<long long>(std::llround(total_ms)));
}

std::string FormatDuration(std::chrono::milliseconds d) {
  auto ms = d.count();
  if (ms == 0) return "0s";
  std::string out;
  if (ms < 0) {
    out = "-";
    ms = -ms;
  }
  if (ms < 1000) return out + fmt::format("{}ms", ms);
  auto h = ms / 3'600'000;
  ms %= 3'600'000;
  auto m = ms / 60'000;
  ms %= 60'000;
  if (h) out += fmt::format("{}h", h);
  if (m) out += fmt::format("{}m", m);
  if (ms) {
    if (ms % 1000 == 0) {
      out += fmt::format("{}s", ms / 1000);
    } else {
      out += fmt::format("{}s", static_cast<double>(ms) / 1000.0);
    }
  }
  return out;
}

}  // namespace spotvisor
