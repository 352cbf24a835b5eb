#include "log/cloudwatch_logs_sink.h"

#include "config/config.h"

#include <mutex>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace spotvisor {
namespace {

CloudWatchLogsSink Sink(std::size_t max_event_bytes = 262'144) {
  CloudWatchLogsOptions o;
  o.endpoint = "http://127.0.0.1:9";  // never contacted: nothing is written
  o.region = "us-east-1";
  o.instance_id = "i-0abc";
  o.labels = {{"experiment", "x"}};
  o.max_event_bytes = max_event_bytes;
  static SystemClock clock;
  return CloudWatchLogsSink(o, std::make_unique<StaticAwsCredentials>(AwsCredentials{"AKID", "secret", ""}, "test"),
                            MakeCurlHttpClient(), clock);
}

TEST_CASE("cloudwatch: spotvisor's events are JSON objects, the trainer's lines stay as printed") {
  auto sink = Sink();
  CHECK(sink.StreamName(false) == "i-0abc/spotvisor");
  CHECK(sink.StreamName(true) == "i-0abc/spotvisor-trainer");
  auto ev = sink.MakeMessages({Severity::kError, "run.end", "bye", {{"reason", "failed"}}}, {}, {{"run_id", "r"}});
  REQUIRE(ev.size() == 1);
  auto j = nlohmann::json::parse(ev[0]);
  CHECK(j["severity"] == "ERROR");
  CHECK(j["event"] == "run.end");
  CHECK(j["message"] == "bye");
  CHECK(j["reason"] == "failed");
  CHECK(j["labels"]["run_id"] == "r");
  CHECK(j["labels"]["experiment"] == "x");
  auto line = sink.MakeMessages({Severity::kInfo, "trainer.output", "epoch 1 loss=0.5", {{"stream", "stdout"}}}, {}, {});
  CHECK(line == std::vector<std::string>{"epoch 1 loss=0.5"});
  // The API refuses an empty message; an empty line is still a line.
  CHECK(sink.MakeMessages({Severity::kInfo, "trainer.output", "", {}}, {}, {}) == std::vector<std::string>{" "});
}

TEST_CASE("cloudwatch: an event above the size limit is cut into parts that fit, losing nothing") {
  auto sink = Sink(10'000);
  std::string message;
  for (int i = 0; message.size() < 50'000; ++i) message += "日本語 line " + std::to_string(i) + " ";
  auto parts = sink.MakeMessages({Severity::kError, "config.error", message, {{"key", "v"}}}, {}, {});
  REQUIRE(parts.size() > 5);
  std::string joined;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    CHECK(parts[i].size() + 26 <= 10'000);
    auto j = nlohmann::json::parse(parts[i]);  // each part is a whole JSON object, valid UTF-8
    CHECK(j["part"] == i + 1);
    CHECK(j["parts"] == parts.size());
    CHECK(j["key"] == "v");
    joined += j["message"].get<std::string>();
  }
  CHECK(joined == message);
  auto lines = sink.MakeMessages({Severity::kInfo, "trainer.output", message, {}}, {}, {});
  REQUIRE(lines.size() > 5);
  std::string again;
  for (auto const& l : lines) {
    CHECK(l.size() + 26 <= 10'000);
    again += l;
  }
  CHECK(again == message);
}

TEST_CASE("cloudwatch: log group names as the API takes them") {
  CHECK(ValidLogGroupName("spotvisor"));
  CHECK(ValidLogGroupName("/aws/ec2/train-runs_2026.#1"));
  CHECK_FALSE(ValidLogGroupName(""));
  CHECK_FALSE(ValidLogGroupName("has space"));
  CHECK_FALSE(ValidLogGroupName("colon:no"));
  CHECK_FALSE(ValidLogGroupName(std::string(513, 'a')));
}

TEST_CASE("SplitUtf8 never cuts a character and loses nothing") {
  std::string s = "aé日本語😀b";
  for (std::size_t max = 1; max <= s.size(); ++max) {
    auto parts = SplitUtf8(s, max);
    std::string joined;
    for (auto const& p : parts) {
      CHECK(p.size() <= std::max<std::size_t>(max, 4));
      if (max >= 4) {
        CHECK((static_cast<unsigned char>(p[0]) & 0xC0) != 0x80);  // starts on a character
      }
      joined += p;
    }
    CHECK(joined == s);
  }
}

// A sink that records its batches instead of sending them.
class RecordingSink final : public BatchingSink {
 public:
  explicit RecordingSink(Limits l) : BatchingSink(l, "the recorder") { Start(); }
  ~RecordingSink() override { Stop(); }
  std::vector<std::vector<std::size_t>> batches() {
    std::lock_guard lk(mu_);
    return batches_;
  }

 private:
  void Encode(const LogEvent& e, WallTime, const std::map<std::string, std::string>&, std::vector<Entry>& out) override {
    // One entry per character of the message, each costing its number.
    for (char c : e.message) out.push_back(Entry{std::string(1, c), static_cast<std::size_t>(c - '0'), 0, 0});
  }
  SendResult Send(std::vector<Entry>& batch) override {
    std::lock_guard lk(mu_);
    std::vector<std::size_t> sizes;
    for (auto const& e : batch) sizes.push_back(e.bytes);
    batches_.push_back(sizes);
    return SendResult{batch.size(), 0, "", ""};
  }
  void Interrupt() override {}
  std::mutex mu_;
  std::vector<std::vector<std::size_t>> batches_;
};

TEST_CASE("batches never exceed their byte bound, and what did not fit goes in the next one") {
  BatchingSink::Limits l;
  l.batch_bytes = 10;
  l.batch_entries = 100;
  l.batch_delay = std::chrono::milliseconds(0);
  RecordingSink sink(l);
  sink.Write({Severity::kInfo, "x", "4444", {}}, {}, {});  // four entries of 4 bytes: 16 in all
  sink.Flush(std::chrono::seconds(10));
  auto batches = sink.batches();
  std::size_t entries = 0;
  for (auto const& b : batches) {
    std::size_t bytes = 0;
    for (auto n : b) bytes += n;
    CHECK(bytes <= 10);
    entries += b.size();
  }
  CHECK(entries == 4);
  CHECK(sink.counters().sent == 4);
}

TEST_CASE("batches never exceed their entry bound") {
  BatchingSink::Limits l;
  l.batch_entries = 3;
  l.batch_delay = std::chrono::milliseconds(0);
  RecordingSink sink(l);
  sink.Write({Severity::kInfo, "x", "11111111", {}}, {}, {});
  sink.Flush(std::chrono::seconds(10));
  std::size_t entries = 0;
  for (auto const& b : sink.batches()) {
    CHECK(b.size() <= 3);
    entries += b.size();
  }
  CHECK(entries == 8);
}

}  // namespace
}  // namespace spotvisor
