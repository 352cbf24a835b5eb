// What the completeness rules (sync/completeness.h) need to know of files
// beyond lstat: which ones processes hold open for writing, and what a
// file's own format says of it. The I/O half of the judgement; the rules
// themselves stay pure.
#pragma once

#include <map>
#include <string>

#include "sync/completeness.h"

namespace spotvisor {

// Files under `dir` that some process holds open for writing (from
// /proc/PID/fd and fdinfo; processes we may not inspect are skipped), by
// path relative to `dir`; the value says whether it was opened with
// O_APPEND (a log).
std::map<std::string, bool> FilesOpenForWriting(const std::string& dir);

// True if any process has a file under `dir` open for writing.
bool AnyFileOpenForWriting(const std::string& dir);

// Reads what `probe` needs of `path` (at most its header, its last 64 KiB,
// or a small file whole) and says whether its format is whole. kPointer:
// `pointer` gets the first line, trimmed.
completeness::Format ProbeFormat(const std::string& path, completeness::Probe probe, std::string* pointer);

}  // namespace spotvisor
