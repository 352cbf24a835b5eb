#include "sync/file_facts.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/strings.h"

namespace spotvisor {
namespace {

// Calls `fn(path, flags)` for every fd of every process whose target is
// under `dir`; stops when `fn` returns false.
void ForEachOpenFile(const std::string& dir, const std::function<bool(std::string_view, unsigned long)>& fn) {
  std::string prefix = dir;
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  prefix += '/';
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return;
  std::unique_ptr<DIR, int (*)(DIR*)> guard(proc, closedir);
  while (dirent* p = readdir(proc)) {
    if (!ParseUint64(p->d_name)) continue;
    std::string base = fmt::format("/proc/{}/fd", p->d_name);
    DIR* fds = opendir(base.c_str());
    if (fds == nullptr) continue;  // gone, or not ours to inspect
    std::unique_ptr<DIR, int (*)(DIR*)> fguard(fds, closedir);
    while (dirent* f = readdir(fds)) {
      if (!ParseUint64(f->d_name)) continue;
      char target[4096];
      ssize_t n = readlinkat(dirfd(fds), f->d_name, target, sizeof target - 1);
      if (n <= 0) continue;
      std::string_view t(target, static_cast<std::size_t>(n));
      if (t.substr(0, prefix.size()) != prefix) continue;
      // flags: in octal, as the kernel prints them.
      int info = open(fmt::format("/proc/{}/fdinfo/{}", p->d_name, f->d_name).c_str(), O_RDONLY | O_CLOEXEC);
      if (info < 0) continue;
      char buf[512];
      ssize_t got = read(info, buf, sizeof buf - 1);
      close(info);
      if (got <= 0) continue;
      std::string text(buf, static_cast<std::size_t>(got));
      auto pos = text.find("flags:");
      if (pos == std::string::npos) continue;
      unsigned long flags = std::strtoul(text.c_str() + pos + 6, nullptr, 8);
      if (!fn(t.substr(prefix.size()), flags)) return;
    }
  }
}

// pread of up to `n` bytes at `off`; what was read.
std::string ReadAt(int fd, std::uint64_t off, std::size_t n) {
  std::string out(n, '\0');
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, out.data() + got, n - got, static_cast<off_t>(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  out.resize(got);
  return out;
}

std::uint64_t Le(std::string_view b, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}

using completeness::Format;

// A zip (torch.save since 1.6, Keras' .keras) is written front to back and
// ends in its end-of-central-directory record, whose comment runs to the
// very end of the file: a file cut short has no such record there.
Format ZipFormat(int fd, std::uint64_t size) {
  if (size == 0) return Format::kTorn;
  auto head = ReadAt(fd, 0, 4);
  if (head != std::string_view("PK\x03\x04", 4)) {
    // Not a zip (an older pickle, another format), unless cut inside its signature.
    return std::string_view("PK\x03\x04", 4).substr(0, head.size()) == head ? Format::kTorn : Format::kUnknown;
  }
  constexpr std::size_t kEocd = 22;
  if (size < kEocd) return Format::kTorn;
  // The common case first (torch.save and Keras write no zip comment): the
  // record is the file's last 22 bytes. Only otherwise read the last 64 KiB.
  if (auto last = ReadAt(fd, size - kEocd, kEocd);
      last.size() == kEocd && last.compare(0, 4, "PK\x05\x06", 4) == 0 && Le(last, 20, 2) == 0) {
    return Format::kWhole;
  }
  std::size_t tail_len = static_cast<std::size_t>(std::min<std::uint64_t>(size, kEocd + 0xFFFF));
  auto tail = ReadAt(fd, size - tail_len, tail_len);
  if (tail.size() != tail_len) return Format::kTorn;
  for (std::size_t i = tail_len - kEocd + 1; i-- > 0;) {
    if (tail.compare(i, 4, "PK\x05\x06", 4) != 0) continue;
    auto comment = Le(tail, i + 20, 2);
    if (i + kEocd + comment == tail_len) return Format::kWhole;
  }
  return Format::kTorn;
}

// safetensors: an 8-byte little-endian header length, a JSON header whose
// tensors' data_offsets are relative to the end of the header, then the
// data: a whole file is exactly as long as the header says.
Format SafetensorsFormat(int fd, std::uint64_t size) {
  if (size < 9) return Format::kTorn;
  auto head = ReadAt(fd, 0, 9);
  if (head.size() != 9) return Format::kTorn;
  if (head[8] != '{') return Format::kUnknown;  // not a safetensors file at all
  auto n = Le(head, 0, 8);
  if (n > 100u * 1024 * 1024) return Format::kUnknown;
  if (8 + n > size) return Format::kTorn;
  auto header = ReadAt(fd, 8, static_cast<std::size_t>(n));
  auto j = nlohmann::json::parse(header, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Format::kUnknown;
  std::uint64_t end = 0;
  for (auto const& [name, t] : j.items()) {
    if (name == "__metadata__" || !t.is_object()) continue;
    auto it = t.find("data_offsets");
    if (it == t.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_unsigned()) return Format::kUnknown;
    end = std::max<std::uint64_t>(end, (*it)[1].get<std::uint64_t>());
  }
  if (end > size) return Format::kTorn;  // more data than the file holds (and no overflow below)
  auto want = 8 + n + end;
  if (size == want) return Format::kWhole;
  return size < want ? Format::kTorn : Format::kUnknown;
}

}  // namespace

std::map<std::string, bool> FilesOpenForWriting(const std::string& dir) {
  std::map<std::string, bool> out;
  ForEachOpenFile(dir, [&](std::string_view rel, unsigned long flags) {
    if ((flags & O_ACCMODE) != O_RDONLY) {
      bool& appending = out.emplace(std::string(rel), true).first->second;
      appending = appending && (flags & O_APPEND) != 0;  // one writer that is not appending makes it a save
    }
    return true;
  });
  return out;
}

bool AnyFileOpenForWriting(const std::string& dir) {
  bool any = false;
  ForEachOpenFile(dir, [&](std::string_view, unsigned long flags) {
    any = (flags & O_ACCMODE) != O_RDONLY;
    return !any;
  });
  return any;
}

Format ProbeFormat(const std::string& path, completeness::Probe probe, std::string* pointer) {
  if (probe == completeness::Probe::kNone) return Format::kUnknown;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Format::kUnknown;  // gone: the snapshot's own checks catch it
  std::unique_ptr<int, void (*)(int*)> guard(&fd, [](int* f) { close(*f); });
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return Format::kUnknown;
  auto size = static_cast<std::uint64_t>(st.st_size);
  switch (probe) {
    case completeness::Probe::kZip: return ZipFormat(fd, size);
    case completeness::Probe::kSafetensors: return SafetensorsFormat(fd, size);
    case completeness::Probe::kJson: {
      if (size > 16u * 1024 * 1024) return Format::kUnknown;
      auto text = ReadAt(fd, 0, static_cast<std::size_t>(size));
      return nlohmann::json::accept(text) ? Format::kWhole : Format::kTorn;
    }
    case completeness::Probe::kPointer: {
      auto text = ReadAt(fd, 0, static_cast<std::size_t>(std::min<std::uint64_t>(size, 4096)));
      auto nl = text.find('\n');
      if (nl != std::string::npos) text.resize(nl);
      while (!text.empty() && (text.back() == ' ' || text.back() == '\r' || text.back() == '\t')) text.pop_back();
      if (pointer) *pointer = text;
      return text.empty() ? Format::kTorn : Format::kWhole;
    }
    case completeness::Probe::kNone: break;
  }
  return Format::kUnknown;
}

}  // namespace spotvisor
