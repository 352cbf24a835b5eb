#include "log/logger.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "common/units.h"

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

// Whether `word` stands in `text` as a whole word: not inside a longer
// name or number ("1" is in "#1:" and "1 file", not in "10" or "0.1").
bool HasWord(std::string_view text, std::string_view word) {
  if (word.empty()) return false;
  auto part_of_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (auto at = text.find(word); at != std::string_view::npos; at = text.find(word, at + 1)) {
    std::size_t end = at + word.size();
    bool before = at > 0 && (part_of_word(text[at - 1]) || (text[at - 1] == '.' && at > 1 && std::isdigit(static_cast<unsigned char>(text[at - 2]))));
    // A number may carry its unit ("0.03s", "5m"); a name may not run on.
    bool number = std::isdigit(static_cast<unsigned char>(word.back()));
    bool after = end < text.size() &&
                 ((number ? std::isdigit(static_cast<unsigned char>(text[end])) != 0 : part_of_word(text[end])) ||
                  (text[end] == '.' && end + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[end + 1]))));
    if (!before && !after) return true;
  }
  return false;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Floats to 3 decimals (seconds to the millisecond), or 3 significant
// digits below 1 (a rate of 0.0161 MB/s is not 0.016): what a person or a
// query can use, not 17 digits of noise.
double Rounded(double v) {
  if (!std::isfinite(v) || v == 0 || std::fabs(v) >= 1e15) return v;
  int decimals = std::max(3, 2 - static_cast<int>(std::floor(std::log10(std::fabs(v)))));
  if (decimals > 300) return v;  // 10^decimals would overflow
  double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

void RoundFloats(nlohmann::json& j) {
  if (j.is_number_float()) {
    j = Rounded(j.get<double>());
  } else if (j.is_structured()) {
    for (auto& child : j) RoundFloats(child);
  }
}

// A float as a text line shows it: as rounded for the JSON, without a
// trailing ".0".
std::string ShortNumber(double v) {
  auto out = Dump(nlohmann::json(Rounded(v)));
  if (out.size() > 2 && out.compare(out.size() - 2, 2, ".0") == 0) out.resize(out.size() - 2);
  return out;
}

}  // namespace

bool MessageSays(std::string_view key, const nlohmann::json& v, std::string_view message) {
  if (v.is_string()) {
    auto const& s = v.get_ref<const std::string&>();
    return s.size() >= 2 && HasWord(message, s);
  }
  if (v.is_number_integer() || v.is_number_unsigned()) {
    auto n = v.is_number_unsigned() ? fmt::format("{}", v.get<std::uint64_t>()) : fmt::format("{}", v.get<std::int64_t>());
    if (HasWord(message, n)) return true;
    bool bytes = key == "bytes" || EndsWith(key, "_bytes");
    return bytes && v.get<std::int64_t>() >= 0 && message.find(FormatBytes(v.get<std::uint64_t>())) != std::string_view::npos;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (EndsWith(key, "_mbps") && message.find(FormatRate(d * 1e6)) != std::string_view::npos) return true;
    for (int decimals = 0; decimals <= 3; ++decimals) {
      if (HasWord(message, fmt::format("{:.{}f}", d, decimals))) return true;
    }
    return false;
  }
  if (v.is_array() && !v.empty()) {
    std::vector<std::string> words;
    for (auto const& w : v) {
      if (!w.is_string()) return false;
      words.push_back(w.get<std::string>());
    }
    return message.find(ShellJoin(words)) != std::string_view::npos;
  }
  return false;
}

std::string TextFields(const nlohmann::json& fields, std::string_view message) {
  std::string out;
  for (auto const& [k, v] : fields.items()) {
    // Nothing to say: zero, false, null, empty. What the message says is not said twice.
    if (v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v.get<double>() == 0) ||
        (v.is_string() && v.get_ref<const std::string&>().empty()) || ((v.is_array() || v.is_object()) && v.empty())) {
      continue;
    }
    if (MessageSays(k, v, message)) continue;
    std::string value;
    if (v.is_string()) {
      value = v.get<std::string>();
    } else if (v.is_number_float()) {
      value = ShortNumber(v.get<double>());
    } else if (v.is_array() && std::all_of(v.begin(), v.end(), [](auto const& w) { return w.is_string(); })) {
      std::vector<std::string> words;
      for (auto const& w : v) words.push_back(w.get<std::string>());
      value = ShellJoin(words);
    } else {
      value = Dump(v);
    }
    if (value.size() > kMaxTextValue) value = value.substr(0, kMaxTextValue - 3) + "...";
    out += fmt::format("  {}={}", k, value);
  }
  return out;
}

namespace {

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
      line = fmt::format("{:02}:{:02}:{:02}.{:03} {:<7} {:<17} {}{}", tm.tm_hour, tm.tm_min, tm.tm_sec, ms,
                         SeverityName(e.severity), e.event, e.message, TextFields(e.fields, e.message));
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

std::optional<WallTime> ParseRfc3339(std::string_view t) {
  // YYYY-MM-DDTHH:MM:SS
  if (t.size() < 20) return std::nullopt;
  auto num = [&](std::size_t at, std::size_t n) -> int {
    int v = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      if (t[i] < '0' || t[i] > '9') return -1;
      v = v * 10 + (t[i] - '0');
    }
    return v;
  };
  if (t[4] != '-' || t[7] != '-' || (t[10] != 'T' && t[10] != 't' && t[10] != ' ') || t[13] != ':' || t[16] != ':') {
    return std::nullopt;
  }
  int year = num(0, 4), mon = num(5, 2), day = num(8, 2), hour = num(11, 2), min = num(14, 2), sec = num(17, 2);
  // Past 2262 nanoseconds since 1970 overflow 64 bits (found by fuzz_upcoming_maintenance).
  if (year < 1970 || year > 2200 || mon < 1 || mon > 12 || day < 1 || day > 31 || hour < 0 || hour > 23 || min < 0 || min > 59 ||
      sec < 0 || sec > 60) {
    return std::nullopt;
  }
  std::size_t i = 19;
  std::int64_t frac_ns = 0;
  if (i < t.size() && t[i] == '.') {
    ++i;
    std::size_t digits = 0;
    std::int64_t scale = 100'000'000;
    for (; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i, ++digits) {
      if (digits < 9) frac_ns += (t[i] - '0') * scale;
      scale /= 10;
    }
    if (digits == 0) return std::nullopt;
  }
  std::int64_t offset_s = 0;
  if (i < t.size() && (t[i] == 'Z' || t[i] == 'z')) {
    ++i;
  } else if (i + 6 == t.size() && (t[i] == '+' || t[i] == '-') && t[i + 3] == ':') {
    int oh = num(i + 1, 2), om = num(i + 4, 2);
    if (oh < 0 || oh > 23 || om < 0 || om > 59) return std::nullopt;
    offset_s = (t[i] == '+' ? 1 : -1) * (oh * 3600 + om * 60);
    i += 6;
  } else {
    return std::nullopt;
  }
  if (i != t.size()) return std::nullopt;
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = mon - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = min;
  tm.tm_sec = sec;
  std::time_t secs = timegm(&tm);
  if (secs == static_cast<std::time_t>(-1)) return std::nullopt;
  auto ns = (static_cast<std::int64_t>(secs) - offset_s) * 1'000'000'000 + frac_ns;
  return WallTime(std::chrono::duration_cast<WallTime::duration>(std::chrono::nanoseconds(ns)));
}

std::string FormatCompactUtc(WallTime t) {
  auto secs = std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
  time_t tt = static_cast<time_t>(secs);
  struct tm tm {};
  gmtime_r(&tt, &tm);
  char out[32];
  strftime(out, sizeof out, "%Y%m%dT%H%M%SZ", &tm);
  return out;
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
  RoundFloats(e.fields);
  std::lock_guard lk(mu_);
  for (auto& s : sinks_) s->Write(e, now, labels_);
}

}  // namespace spotvisor
