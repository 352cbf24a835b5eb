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
  auto out = sink.MakeEntry({Severity::kInfo, "trainer.output", "hi", {{"stream", "stderr"}}}, {}, {{"run_id", "r"}});
  CHECK(out["logName"] == "projects/p/logs/spotvisor-trainer");
  CHECK(out["jsonPayload"]["stream"] == "stderr");
  CHECK(out["labels"]["experiment"] == "x");
  CHECK(out["labels"]["run_id"] == "r");
  auto ev = sink.MakeEntry({Severity::kError, "run.end", "bye", {{"reason", "failed"}}}, {}, {});
  CHECK(ev["logName"] == "projects/p/logs/spotvisor");
  CHECK(ev["severity"] == "ERROR");
  CHECK(ev["jsonPayload"]["reason"] == "failed");
}

TEST_CASE("an entry above the size limit is cut, not rejected whole") {
  auto sink = Sink(10'000);
  auto e = sink.MakeEntry({Severity::kInfo, "config.error", std::string(50'000, 'x'), {}}, {}, {});
  CHECK(e.dump().size() <= 10'000);
  CHECK(e["jsonPayload"]["truncated_bytes"].get<std::size_t>() > 40'000);
  CHECK(e["jsonPayload"]["event"] == "config.error");
}

}  // namespace
}  // namespace spotvisor
