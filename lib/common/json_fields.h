// Fields of JSON that came from outside (an API's answer, an object in the
// bucket): read without throwing. nlohmann's value() throws when the field is
// there with another type; these give the fallback instead.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace spotvisor {

inline std::string JsonString(const nlohmann::json& j, const char* key, std::string fallback = "") {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

inline std::int64_t JsonInt(const nlohmann::json& j, const char* key, std::int64_t fallback) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
}

}  // namespace spotvisor
