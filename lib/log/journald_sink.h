#pragma once

#include <memory>

#include "log/logger.h"

namespace spotvisor {

// log-to = journald: each event as one journal entry with native fields
// (MESSAGE, PRIORITY, SYSLOG_IDENTIFIER=spotvisor, SPOTVISOR_EVENT and every
// field as SPOTVISOR_<NAME>, labels as SPOTVISOR_LABEL_<NAME>), so
// `journalctl -t spotvisor SPOTVISOR_EVENT=run.end` finds them without
// parsing JSON. Trainer lines use SYSLOG_IDENTIFIER=spotvisor-trainer.
std::unique_ptr<LogSink> MakeJournaldSink();

}  // namespace spotvisor
