#include "log/logger.h"

#include <ctime>

#include <fmt/format.h>

namespace spotvisor {
namespace {

template <typename Json>
std::string Dump(const Json& j) {
  // Replace rather than throw on invalid UTF-8: a log line must never crash us.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class JsonSink final : public LogSink {
 public:
  explicit JsonSink(std::FILE* out) : out_(out) {}
  void Write(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels) override {
    // Ordered, so a person reading the raw line sees severity and message first.
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    j["severity"] = SeverityName(e.severity);
    j["logging.googleapis.com/severity"] = SeverityName(e.severity);
    j["message"] = e.message;
    j["time"] = FormatRfc3339(time);
    j["event"] = e.event;
    if (!labels.empty()) j["logging.googleapis.com/labels"] = labels;
    for (auto const& [k, v] : e.fields.items()) j[k] = v;
    auto line = Dump(j);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), out_);
  }
  // One flush per batch of lines (AsyncSink calls it), not one per line: a
  // write(2) per line made a flooding trainer lose most of its output.
  void Flush(std::chrono::milliseconds) override { std::fflush(out_); }

 private:
  std::FILE* out_;
};

class TextSink final : public LogSink {
 public:
  explicit TextSink(std::FILE* out) : out_(out) {}
  void Write(const LogEvent& e, WallTime time, const std::map<std::string, std::string>&) override {
    auto t = std::chrono::system_clock::to_time_t(time);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count() % 1000;
    std::tm tm{};
    localtime_r(&t, &tm);
    std::string line;
    if (e.event == "trainer.output") {
      // Trainer output reads best with nothing but the stream in front.
      line = fmt::format("{:02}:{:02}:{:02}.{:03} {:<7}| {}", tm.tm_hour, tm.tm_min, tm.tm_sec, ms,
                         e.fields.value("stream", "trainer"), e.message);
    } else {
      line = fmt::format("{:02}:{:02}:{:02}.{:03} {:<7} {:<22} {}", tm.tm_hour, tm.tm_min, tm.tm_sec, ms,
                         SeverityName(e.severity), e.event, e.message);
      for (auto const& [k, v] : e.fields.items()) {
        line += fmt::format("  {}={}", k, v.is_string() ? v.get<std::string>() : Dump(v));
      }
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), out_);
  }
  void Flush(std::chrono::milliseconds) override { std::fflush(out_); }

 private:
  std::FILE* out_;
};

}  // namespace

const char* SeverityName(Severity s) {
  switch (s) {
    case Severity::kDebug: return "DEBUG";
    case Severity::kInfo: return "INFO";
    case Severity::kNotice: return "NOTICE";
    case Severity::kWarning: return "WARNING";
    case Severity::kError: return "ERROR";
    case Severity::kCritical: return "CRITICAL";
  }
  return "DEFAULT";
}

std::string FormatRfc3339(WallTime t) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ns % 1'000'000'000);
}

std::unique_ptr<LogSink> MakeJsonSink(std::FILE* out) { return std::make_unique<JsonSink>(out); }
std::unique_ptr<LogSink> MakeTextSink(std::FILE* out) { return std::make_unique<TextSink>(out); }

void Logger::AddSink(std::unique_ptr<LogSink> sink) {
  std::lock_guard lk(mu_);
  sinks_.push_back(std::move(sink));
}

void Logger::ClearSinks() {
  std::lock_guard lk(mu_);
  sinks_.clear();
}

void Logger::Flush(std::chrono::milliseconds timeout) {
  std::vector<LogSink*> sinks;
  {
    std::lock_guard lk(mu_);
    for (auto& s : sinks_) sinks.push_back(s.get());
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto* s : sinks) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    s->Flush(std::max(left, std::chrono::milliseconds(0)));
  }
}

void Logger::SetLabel(const std::string& key, const std::string& value) {
  std::lock_guard lk(mu_);
  labels_[key] = value;
}

void Logger::Log(LogEvent e) {
  auto now = clock_.WallNow();
  std::lock_guard lk(mu_);
  for (auto& s : sinks_) s->Write(e, now, labels_);
}

}  // namespace spotvisor
