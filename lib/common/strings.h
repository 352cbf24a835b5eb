#pragma once

#include <cstdint>
#include <optional>

#include <string>
#include <string_view>
#include <vector>

namespace spotvisor {

std::string_view Trim(std::string_view s);
std::vector<std::string> SplitLines(std::string_view s);
bool StartsWith(std::string_view s, std::string_view prefix);
// path is dir or lies below it ("/a/b" is under "/a", "/ab" is not); an empty dir has nothing under it.
bool PathIsUnder(std::string_view path, std::string_view dir);
// Split on one character; empty fields are kept.
std::vector<std::string> SplitOn(std::string_view s, char sep);
// Edit distance, for did-you-mean suggestions on misspelt keys.
std::size_t EditDistance(std::string_view a, std::string_view b);
// The closest candidate within a small distance, or "" when none is close.
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);
// A plain decimal number (digits only, no sign, no spaces) that fits in 64
// bits; nullopt otherwise. For numbers that come from outside.
std::optional<std::uint64_t> ParseUint64(std::string_view s);
// Percent-encodes everything but unreserved characters (RFC 3986: letters,
// digits, "-._~"); '/' becomes %2F. For URL path segments, query values and
// form bodies.
std::string UrlEncode(std::string_view s);

}  // namespace spotvisor
