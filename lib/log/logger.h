// Structured events: every line spotvisor prints is one event with a stable
// name. On a pipe (journald under systemd) each is a JSON object in Cloud
// Logging's structured format; on a terminal, readable text.
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"

namespace spotvisor {

enum class Severity { kDebug, kInfo, kNotice, kWarning, kError, kCritical };
const char* SeverityName(Severity s);

struct LogEvent {
  Severity severity = Severity::kInfo;
  std::string event;  // stable name, e.g. "trainer.exit"; docs/architecture.md lists them
  std::string message;
  nlohmann::json fields = nlohmann::json::object();
};

class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void Write(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels) = 0;
  // Blocks until what was written is delivered, or `timeout` passes.
  virtual void Flush(std::chrono::milliseconds /*timeout*/) {}
};

// One JSON object per line: severity (both the plain and the
// logging.googleapis.com/ spelling, so every agent path reads it), message,
// time (RFC 3339, UTC, nanoseconds), event, labels, then the event's fields.
std::unique_ptr<LogSink> MakeJsonSink(std::FILE* out);
// "10:04:05.123 INFO    trainer.start     message  key=value ...": for a
// person at a terminal. The key=value pairs leave out what the message
// already says (TextFields); the JSON line keeps every field.
std::unique_ptr<LogSink> MakeTextSink(std::FILE* out);

// Whether `message` already says field `key`'s value: the same word or
// number, a byte count as FormatBytes writes it, seconds to 0-3 decimals, a
// `_mbps` rate as FormatRate writes it, an argv as ShellJoin writes it.
bool MessageSays(std::string_view key, const nlohmann::json& value, std::string_view message);
// The "  key=value" pairs of a text line: fields the message does not say
// that are not zero, false, null or empty; floats to 3 decimals, an argv as
// a shell line, a value cut at kMaxTextValue characters.
inline constexpr std::size_t kMaxTextValue = 48;
std::string TextFields(const nlohmann::json& fields, std::string_view message);

std::string FormatRfc3339(WallTime t);
// "20261128T101500Z": a UTC time to the second that sorts as text, for names.
std::string FormatCompactUtc(WallTime t);
// "2026-11-24T22:44:01.123Z" or with a "+01:00" offset (what FormatRfc3339,
// Cloud Storage and the metadata server write), years 1970-2200; nullopt for
// anything else.
// Text from outside: every field is checked.
std::optional<WallTime> ParseRfc3339(std::string_view text);

class Logger {
 public:
  explicit Logger(const Clock& clock) : clock_(clock) {}

  void AddSink(std::unique_ptr<LogSink> sink);
  void ClearSinks();
  void SetLabel(const std::string& key, const std::string& value);
  // Before the VM powers off: the last lines say why it stopped.
  void Flush(std::chrono::milliseconds timeout);
  // Thread-safe; invalid UTF-8 in message or fields is replaced, never thrown.
  void Log(LogEvent e);

  void Info(std::string event, std::string message, nlohmann::json fields = nlohmann::json::object()) {
    Log({Severity::kInfo, std::move(event), std::move(message), std::move(fields)});
  }
  void Warn(std::string event, std::string message, nlohmann::json fields = nlohmann::json::object()) {
    Log({Severity::kWarning, std::move(event), std::move(message), std::move(fields)});
  }
  void Error(std::string event, std::string message, nlohmann::json fields = nlohmann::json::object()) {
    Log({Severity::kError, std::move(event), std::move(message), std::move(fields)});
  }

 private:
  const Clock& clock_;
  std::mutex mu_;
  std::vector<std::unique_ptr<LogSink>> sinks_;
  std::map<std::string, std::string> labels_;
};

}  // namespace spotvisor
