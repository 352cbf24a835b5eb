#include "log/cloud_logging_sink.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

CloudLoggingSink Sink(std::size_t max_entry_bytes = 200'000) {
  CloudLoggingOptions o;
  o.endpoint = "http://127.0.0.1:9";  // never contacted: nothing is written
  o.project_id = "p";
  o.labels = {{"experiment", "x"}};
  o.max_entry_bytes = max_entry_bytes;
  return CloudLoggingSink(o, MakeNoAuthTokenProvider(), MakeCurlHttpClient());
}

TEST_CASE("log names are URL-encoded as the API requires") {
  CHECK(LogName("p", "spotvisor") == "projects/p/logs/spotvisor");
  CHECK(LogName("p", "a/b c") == "projects/p/logs/a%2Fb%20c");
}

TEST_CASE("entries: trainer output and events go to their own logs, with severity and merged labels") {
  auto sink = Sink();
  auto outs = sink.MakeEntries({Severity::kInfo, "trainer.output", "hi", {{"stream", "stderr"}}}, {}, {{"run_id", "r"}});
  REQUIRE(outs.size() == 1);
  auto out = outs[0];
  CHECK(out["logName"] == "projects/p/logs/spotvisor-trainer");
  CHECK(out["jsonPayload"]["stream"] == "stderr");
  CHECK(out["labels"]["experiment"] == "x");
  CHECK(out["labels"]["run_id"] == "r");
  auto ev = sink.MakeEntries({Severity::kError, "run.end", "bye", {{"reason", "failed"}}}, {}, {})[0];
  CHECK(ev["logName"] == "projects/p/logs/spotvisor");
  CHECK(ev["severity"] == "ERROR");
  CHECK(ev["jsonPayload"]["reason"] == "failed");
}

TEST_CASE("an entry above the size limit is split into parts that fit, losing nothing") {
  auto sink = Sink(10'000);
  std::string message;
  for (int i = 0; message.size() < 50'000; ++i) message += "日本語 line " + std::to_string(i) + " ";
  auto parts = sink.MakeEntries({Severity::kError, "config.error", message, {{"key", "v"}}}, {}, {});
  REQUIRE(parts.size() > 5);
  std::string joined;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    CHECK(parts[i].dump().size() <= 10'000);
    CHECK(parts[i]["jsonPayload"]["part"] == i + 1);
    CHECK(parts[i]["jsonPayload"]["parts"] == parts.size());
    CHECK(parts[i]["jsonPayload"]["key"] == "v");
    CHECK(parts[i]["severity"] == "ERROR");
    joined += parts[i]["jsonPayload"]["message"].get<std::string>();  // valid UTF-8 or dump() would throw
  }
  CHECK(joined == message);
}

}  // namespace
}  // namespace spotvisor
