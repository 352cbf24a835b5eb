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

}  // namespace
}  // namespace spotvisor
