#include "state/status_file.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>

namespace spotvisor {
namespace {

TEST_CASE("status.json round trip, replaced atomically without temporary leftovers") {
  char tmpl[] = "/tmp/spotvisor-status-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  REQUIRE(WriteStatusFile(dir, {{"phase", "running"}}).ok());
  REQUIRE(WriteStatusFile(dir, {{"phase", "stopping"}, {"trainer_pid", 42}}).ok());
  auto j = ReadStatusFile(dir);
  REQUIRE(j.ok());
  CHECK((*j)["phase"] == "stopping");
  CHECK((*j)["trainer_pid"] == 42);
  int files = 0;
  for (auto const& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++files;
  }
  CHECK(files == 1);
  std::filesystem::remove_all(dir);
  CHECK(ReadStatusFile(dir).status().code() == StatusCode::kNotFound);
  CHECK(WriteStatusFile(dir, {}).code() == StatusCode::kNotFound);
}

TEST_CASE("status.json with wrong types is an error naming the field, not an exception", "[status_file]") {
  // `spotvisor status` read these with value() / get<>(), which throw.
  for (auto [text, field] : std::initializer_list<std::pair<const char*, const char*>>{
           {R"({"pid":1,"spotvisor_pid":"x"})", "spotvisor_pid"},
           {R"({"spotvisor_pid":1.5e300})", "spotvisor_pid"},
           {R"({"spotvisor_pid":99999999999})", "spotvisor_pid"},
           {R"({"phase":7})", "phase"},
           {R"({"exit_code":"0"})", "exit_code"},
           {R"({"trainer_pid":[1]})", "trainer_pid"},
           {R"({"last_event":"started"})", "last_event"},
           {R"({"last_event":{"event":null}})", "event"},
           {R"({"last_sync":{"ok":"yes"}})", "ok"},
           {R"({"last_sync":{"sequence":-1}})", "sequence"},
           {R"({"last_sync":{"files_uploaded":1e400}})", ""},
           {R"({"checkpoint":[]})", "checkpoint"},
           {R"({"checkpoint":{"sequence":"7"}})", "sequence"},
           {R"({"checkpoint":{"age_s":"old"}})", "age_s"},
           {R"({"checkpoint":{"uncommitted_bytes":-5}})", "uncommitted_bytes"},
           {R"({"checkpoint":{"stalled":"yes"}})", "stalled"},
           {R"({"checkpoint":{"caught_up_at":1}})", "caught_up_at"},
       }) {
    INFO(text);
    auto j = ParseStatusJson(text, "/run/spotvisor/status.json");
    REQUIRE_FALSE(j.ok());
    CHECK(j.status().code() == StatusCode::kFailedPrecondition);
    CHECK(j.status().message().find("/run/spotvisor/status.json") == 0);
    CHECK(j.status().message().find(field) != std::string::npos);
  }
  for (auto text : {"[]", "\"running\"", "null", "", "{", "\xff"}) {
    INFO(text);
    CHECK_FALSE(ParseStatusJson(text, "s").ok());
  }
  // 100000 levels: nlohmann's dump() recurses per level and would overflow the stack.
  CHECK_FALSE(ParseStatusJson("{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}", "s").ok());
  // What the supervisor writes reads back; unknown fields are allowed.
  auto ok = ParseStatusJson(R"({"spotvisor_pid":12,"trainer_pid":null,"exit_code":-1,"future_field":{"a":[1]},
                                "last_sync":{"ok":true,"sequence":3,"bytes":1099511627776,"files_uploaded":2},
                                "checkpoint":{"sequence":3,"files":2,"bytes":10,"committed_at":null,"age_s":null,
                                              "lag_s":1.5,"uncommitted_files":0,"uncommitted_bytes":0,"stalled":false}})",
                            "s");
  CHECK(ok.ok());
}

TEST_CASE("status.json is written even when a value is not UTF-8", "[status_file]") {
  char tmpl[] = "/tmp/spotvisor-status-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  // dump() threw type_error 316 here: the supervisor's thread died.
  REQUIRE(WriteStatusFile(dir, {{"phase", "running"}, {"last_event", {{"event", "x"}, {"message", "bad \xff\xfe byte"}}}}).ok());
  auto j = ReadStatusFile(dir);
  REQUIRE(j.ok());
  CHECK((*j)["last_event"]["message"] == "bad \xEF\xBF\xBD\xEF\xBF\xBD byte");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace spotvisor
