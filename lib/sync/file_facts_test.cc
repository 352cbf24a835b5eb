#include "sync/file_facts.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <catch2/catch.hpp>

#include "testing/files.h"

namespace spotvisor {
namespace {

namespace fs = std::filesystem;
using completeness::Format;
using completeness::Probe;

struct Dir {
  Dir() {
    char tmpl[] = "/tmp/spotvisor-facts-XXXXXX";
    root = mkdtemp(tmpl);
  }
  ~Dir() { fs::remove_all(root); }
  std::string root;
};

std::string Eocd(const std::string& comment) {
  std::string e("PK\x05\x06", 4);
  e += std::string(16, '\0');
  e += static_cast<char>(comment.size() & 0xff);
  e += static_cast<char>(comment.size() >> 8);
  return e + comment;
}

Format Probed(const std::string& path, Probe p, std::string* pointer = nullptr) { return ProbeFormat(path, p, pointer); }

TEST_CASE("a zip (torch.save, .keras) is whole when its end record ends the file") {
  Dir d;
  auto path = d.root + "/model.pt";
  std::string head("PK\x03\x04", 4);
  testfiles::Write(path, head + std::string(5000, 'x') + Eocd(""));
  CHECK(Probed(path, Probe::kZip) == Format::kWhole);
  testfiles::Write(path, head + std::string(5000, 'x') + Eocd("a comment"));
  CHECK(Probed(path, Probe::kZip) == Format::kWhole);
  testfiles::Write(path, head + std::string(5000, 'x'));  // cut before the central directory
  CHECK(Probed(path, Probe::kZip) == Format::kTorn);
  testfiles::Write(path, "");  // O_TRUNC, nothing written yet
  CHECK(Probed(path, Probe::kZip) == Format::kTorn);
  testfiles::Write(path, "PK");  // cut inside the signature
  CHECK(Probed(path, Probe::kZip) == Format::kTorn);
  testfiles::Write(path, "an older pickle, not a zip");
  CHECK(Probed(path, Probe::kZip) == Format::kUnknown);
}

TEST_CASE("a safetensors file is whole when its size is what its header says") {
  Dir d;
  auto path = d.root + "/model.safetensors";
  std::string header = R"({"w":{"dtype":"U8","shape":[10],"data_offsets":[0,10]}})";
  std::string len(8, '\0');
  len[0] = static_cast<char>(header.size());
  testfiles::Write(path, len + header + std::string(10, 'd'));
  CHECK(Probed(path, Probe::kSafetensors) == Format::kWhole);
  testfiles::Write(path, len + header + std::string(4, 'd'));
  CHECK(Probed(path, Probe::kSafetensors) == Format::kTorn);
  std::string huge = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551615]}})";
  std::string hlen(8, '\0');
  hlen[0] = static_cast<char>(huge.size());
  testfiles::Write(path, hlen + huge + "d");
  CHECK(Probed(path, Probe::kSafetensors) == Format::kTorn);  // no overflow into "whole"
  testfiles::Write(path, "step=1 not safetensors at all");
  CHECK(Probed(path, Probe::kSafetensors) == Format::kUnknown);
}

TEST_CASE("trainer_state.json must parse; a pointer's first line is read") {
  Dir d;
  auto json = d.root + "/trainer_state.json";
  testfiles::Write(json, R"({"global_step": 5})");
  CHECK(Probed(json, Probe::kJson) == Format::kWhole);
  testfiles::Write(json, R"({"global_st)");
  CHECK(Probed(json, Probe::kJson) == Format::kTorn);
  auto latest = d.root + "/latest";
  testfiles::Write(latest, "global_step20\n");
  std::string pointer;
  CHECK(Probed(latest, Probe::kPointer, &pointer) == Format::kWhole);
  CHECK(pointer == "global_step20");
}

TEST_CASE("files held open for writing are found, and whether for appending") {
  Dir d;
  int save = open((d.root + "/model.pt").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  int log = open((d.root + "/train.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int read_only = open((d.root + "/model.pt").c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(save >= 0);
  REQUIRE(log >= 0);
  REQUIRE(read_only >= 0);
  auto open_now = FilesOpenForWriting(d.root);
  CHECK(open_now.size() == 2);
  CHECK(open_now.at("model.pt") == false);
  CHECK(open_now.at("train.log") == true);
  close(save);
  close(log);
  CHECK(FilesOpenForWriting(d.root).empty());
  CHECK_FALSE(AnyFileOpenForWriting(d.root));
  close(read_only);
}

}  // namespace
}  // namespace spotvisor
