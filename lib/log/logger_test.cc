#include "log/logger.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

namespace spotvisor {
namespace {

class FixedClock final : public Clock {
 public:
  SteadyTime Now() const override { return SteadyTime{}; }
  WallTime WallNow() const override { return WallTime(std::chrono::seconds(1'795'000'000)); }
};

// Every line a sink writes, through a memory stream.
struct Captured {
  char* buf = nullptr;
  std::size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  ~Captured() {
    if (f) std::fclose(f);
    std::free(buf);
  }
  std::string Text() {
    std::fflush(f);
    return std::string(buf, size);
  }
};

TEST_CASE("a text line leaves out what its message already says") {
  // The supervisor.state line: the message names both states and why.
  CHECK(TextFields({{"from", "starting"}, {"to", "restoring"}, {"why", "restoring the newest complete checkpoint"},
                    {"deadline_s", 1800.0}},
                   "starting -> restoring: restoring the newest complete checkpoint") == "  deadline_s=1800");
  // A deadline the message gives with fewer decimals is said too.
  CHECK(TextFields({{"deadline_s", 26.973}}, "final sync within the Spot window (26.973s left)").empty());
  CHECK(TextFields({{"duration_s", 0.027}}, "uploaded in 0.03s").empty());
  // Sizes and rates as the message writes them.
  CHECK(TextFields({{"bytes", 1'610'612'736}, {"throughput_mbps", 45.2}}, "1.6 GB in 35.63s (45.2 MB/s)").empty());
  CHECK(TextFields({{"uncommitted_bytes", 1500}}, "1.5 kB not committed") .empty());
  // An argv as the message's shell line.
  CHECK(TextFields({{"command", {"python3", "train.py"}}}, "run r starting: python3 train.py").empty());
}

TEST_CASE("a number inside a longer number or word is not the field's value") {
  CHECK(TextFields({{"attempts", 3}}, "sync #13: 3.5 kB in 0.3s") == "  attempts=3");
  CHECK(TextFields({{"attempts", 3}}, "tried 3 times") == "");
  CHECK(TextFields({{"kind", "final"}}, "finally") == "  kind=final");
  CHECK(TextFields({{"pid", 12}}, "v1.12 pid12") == "  pid=12");
}

TEST_CASE("zero, false, null and empty fields have nothing to say on a text line") {
  CHECK(TextFields({{"files_deferred", 0}, {"staged", false}, {"left_out", nlohmann::json::array()}, {"error", ""},
                    {"uncommitted_files", nullptr}, {"extra", nlohmann::json::object()}, {"ratio", 0.0}},
                   "m")
            .empty());
  // ... but true and non-zero values are.
  CHECK(TextFields({{"staged", true}, {"files_deleted", 2}}, "m") == "  files_deleted=2  staged=true");
}

TEST_CASE("text values are short: floats as rounded, long values cut") {
  CHECK(TextFields({{"deadline_s", 1800.0}, {"ratio", 1.25}}, "m") == "  deadline_s=1800  ratio=1.25");
  CHECK(TextFields({{"age_s", 0.011068728}}, "m") == "  age_s=0.0111");
  CHECK(TextFields({{"argv", {"python3", "-c", "print('a very long program text that goes on and on')"}}}, "m") ==
        "  argv=python3 -c 'print('\\''a very long program tex...");
  auto cut = TextFields({{"path", std::string(200, 'x')}}, "m");
  CHECK(cut.size() == std::string("  path=").size() + kMaxTextValue);
}

TEST_CASE("floats in events are rounded for both sinks, integers kept exact") {
  FixedClock clock;
  Logger log(clock);
  Captured json, text;
  log.AddSink(MakeJsonSink(json.f));
  log.AddSink(MakeTextSink(text.f));
  log.Info("sync.complete", "periodic sync #1: 9 of 9 file(s) uploaded, 441 bytes in 0.03s (16.1 kB/s)",
           {{"duration_s", 0.027327762}, {"throughput_mbps", 0.016137435623158603}, {"bytes", 441}, {"files", 9},
            {"nested", {{"ratio", 1234.56789}}}, {"big", 18446744073709551615ULL}, {"attempts", 1},
            {"tiny", 0.000012345}, {"denormal", 1e-320}});
  auto j = nlohmann::json::parse(json.Text());
  CHECK(j["duration_s"] == 0.0273);
  CHECK(j["throughput_mbps"] == 0.0161);
  CHECK(j["nested"]["ratio"] == 1234.568);
  CHECK(j["big"] == 18446744073709551615ULL);
  CHECK(j["tiny"] == 0.0000123);
  CHECK(j["denormal"] == 1e-320);  // too small for 3 decimals: 3 significant digits, not 0
  CHECK(json.Text().find("\"throughput_mbps\":0.0161,") != std::string::npos);  // written short: not 0.016100000000000000
  auto line = text.Text();
  CHECK(line.find("throughput_mbps") == std::string::npos);
  CHECK(line.find("bytes=") == std::string::npos);
  CHECK(line.find("nested={\"ratio\":1234.568}") != std::string::npos);
}

TEST_CASE("a JSON line names each fact once") {
  FixedClock clock;
  Logger log(clock);
  Captured json;
  log.AddSink(MakeJsonSink(json.f));
  log.SetLabel("run_id", "r1");
  log.Info("trainer.start", "trainer started as pid 7", {{"pid", 7}});
  auto text = json.Text();
  auto j = nlohmann::json::parse(text);
  // Severity twice, on purpose: Google's agents read one spelling or the other (REFERENCE.md).
  CHECK(j["severity"] == "INFO");
  CHECK(j["logging.googleapis.com/severity"] == "INFO");
  CHECK(j["logging.googleapis.com/labels"]["run_id"] == "r1");
  CHECK(j.size() == 7);
  CHECK(text.find("\"pid\"") == text.rfind("\"pid\""));
}

}  // namespace
}  // namespace spotvisor
