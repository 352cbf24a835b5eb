#include "log/journald_sink.h"

#include <sys/uio.h>
#include <systemd/sd-journal.h>

#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

namespace spotvisor {
namespace {

int SyslogPriority(Severity s) {
  switch (s) {
    case Severity::kDebug: return 7;
    case Severity::kInfo: return 6;
    case Severity::kNotice: return 5;
    case Severity::kWarning: return 4;
    case Severity::kError: return 3;
    case Severity::kCritical: return 2;
  }
  return 6;
}

// Journal field names: A-Z, 0-9 and _, not starting with a digit or _.
std::string FieldName(const std::string& prefix, const std::string& key) {
  std::string out = prefix;
  for (char c : key) out += std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : '_';
  return out.substr(0, 64);
}

class JournaldSink final : public LogSink {
 public:
  void Write(const LogEvent& e, WallTime, const std::map<std::string, std::string>& labels) override {
    std::vector<std::string> fields = {
        "MESSAGE=" + e.message,
        "PRIORITY=" + std::to_string(SyslogPriority(e.severity)),
        std::string("SYSLOG_IDENTIFIER=") + (e.event == "trainer.output" ? "spotvisor-trainer" : "spotvisor"),
        "SPOTVISOR_EVENT=" + e.event,
    };
    for (auto const& [k, v] : e.fields.items()) {
      fields.push_back(FieldName("SPOTVISOR_", k) + "=" + (v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
    }
    for (auto const& [k, v] : labels) fields.push_back(FieldName("SPOTVISOR_LABEL_", k) + "=" + v);
    std::vector<iovec> iov;
    for (auto& f : fields) iov.push_back({f.data(), f.size()});
    int rc = sd_journal_sendv(iov.data(), static_cast<int>(iov.size()));
    if (rc < 0 && !warned_) {
      // The journal is our log: if it is unreachable, stderr is all that is left.
      warned_ = true;
      std::fprintf(stderr, "spotvisor: cannot write to the journal (error %d); is systemd-journald running?\n", -rc);
    }
  }

 private:
  bool warned_ = false;
};

}  // namespace

std::unique_ptr<LogSink> MakeJournaldSink() { return std::make_unique<JournaldSink>(); }

}  // namespace spotvisor
