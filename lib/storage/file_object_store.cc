#include "storage/file_object_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "storage/crc32c.h"

namespace spotvisor {
namespace {

namespace fs = std::filesystem;

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;  // a copy would close the descriptor twice
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

std::int64_t Generation(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// Copies in -> out, returning the crc32c and size of what was copied.
Status Copy(int in, int out, std::uint32_t& crc, std::uint64_t& size, const std::string& what) {
  char buf[1 << 16];
  crc = 0;
  size = 0;
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "reading " + what);
    if (n == 0) return OkStatus();
    crc = Crc32cExtend(crc, std::string_view(buf, static_cast<std::size_t>(n)));
    size += static_cast<std::size_t>(n);
    for (ssize_t done = 0; done < n;) {
      ssize_t w = write(out, buf + done, static_cast<std::size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoToStatus(errno, "writing " + what);
      done += w;
    }
  }
}

class FileObjectStore final : public ObjectStore {
 public:
  explicit FileObjectStore(std::string root) : root_(std::move(root)) {}

  std::string Describe() const override { return "file://" + root_; }

  StatusOr<ObjectInfo> UploadFile(const std::string& name, const std::string& path, const Precondition& pre,
                                  const CallContext& ctx) override {
    if (auto s = ctx.Check("uploading " + path); !s.ok()) return s;
    Fd in(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (in.fd < 0) return ErrnoToStatus(errno, "opening " + path);
    auto r = Write(name, pre, [&](int out, std::uint32_t& crc, std::uint64_t& size) { return Copy(in.fd, out, crc, size, path); });
    if (r.ok()) ctx.Moved(static_cast<std::int64_t>(r->size));
    return r;
  }

  StatusOr<ObjectInfo> UploadBytes(const std::string& name, const std::string& data, const Precondition& pre,
                                   const CallContext& ctx) override {
    if (auto s = ctx.Check("writing " + Path(name)); !s.ok()) return s;
    return Write(name, pre, [&](int out, std::uint32_t& crc, std::uint64_t& size) -> Status {
      crc = Crc32c(data);
      size = data.size();
      for (std::size_t done = 0; done < data.size();) {
        ssize_t w = write(out, data.data() + done, data.size() - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return ErrnoToStatus(errno, "writing " + Path(name));
        done += static_cast<std::size_t>(w);
      }
      return OkStatus();
    });
  }

  StatusOr<std::string> ReadBytes(const std::string& name, ObjectInfo* info, const CallContext& ctx) override {
    if (auto s = ctx.Check("reading " + Path(name)); !s.ok()) return s;
    Fd in(open(Path(name).c_str(), O_RDONLY | O_CLOEXEC));
    if (in.fd < 0) return ErrnoToStatus(errno, Describe() + "/" + name);
    struct stat st {};
    fstat(in.fd, &st);
    std::string data(static_cast<std::size_t>(st.st_size), '\0');
    std::size_t got = 0;
    while (got < data.size()) {
      ssize_t n = read(in.fd, data.data() + got, data.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return ErrnoToStatus(n < 0 ? errno : EIO, "reading " + Path(name));
      got += static_cast<std::size_t>(n);
    }
    if (info) *info = ObjectInfo{name, Generation(st), data.size(), Crc32c(data)};
    return data;
  }

  StatusOr<ObjectInfo> DownloadToFile(const std::string& name, const std::string& path, std::uint64_t /*size_hint*/,
                                      const CallContext& ctx) override {
    if (auto s = ctx.Check("reading " + Path(name)); !s.ok()) return s;
    Fd in(open(Path(name).c_str(), O_RDONLY | O_CLOEXEC));
    if (in.fd < 0) return ErrnoToStatus(errno, Describe() + "/" + name);
    struct stat st {};
    fstat(in.fd, &st);
    Fd out(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (out.fd < 0) return ErrnoToStatus(errno, "creating " + path);
    ObjectInfo o{name, Generation(st), 0, 0};
    if (auto s = Copy(in.fd, out.fd, o.crc32c, o.size, path); !s.ok()) return s;
    if (fsync(out.fd) != 0) return ErrnoToStatus(errno, "flushing " + path);
    ctx.Moved(static_cast<std::int64_t>(o.size));
    return o;
  }

  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix, const CallContext& ctx) override {
    if (auto s = ctx.Check("listing " + root_); !s.ok()) return s;
    std::vector<ObjectInfo> out;
    std::error_code ec;
    if (!fs::exists(root_, ec)) return out;
    for (auto it = fs::recursive_directory_iterator(root_, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      auto full = it->path().string();
      auto rel = full.substr(std::min(full.size(), root_.size() + 1));
      if (rel == ".lock" || rel.rfind(prefix, 0) != 0) continue;
      // A temporary name is an upload in progress, unless its writer is
      // dead (killed mid-upload): then it is listed, so garbage collection
      // can delete it.
      if (auto tmp = rel.find(".spotvisor-tmp."); tmp != std::string::npos) {
        auto pid = std::atoi(rel.c_str() + tmp + 15);
        if (pid <= 0 || pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
      }
      struct stat st {};
      if (stat(it->path().c_str(), &st) != 0) continue;
      out.push_back(ObjectInfo{rel, Generation(st), static_cast<std::uint64_t>(st.st_size), 0});
    }
    if (ec) return ErrnoToStatus(ec.value(), "listing " + root_);
    std::sort(out.begin(), out.end(), [](auto const& a, auto const& b) { return a.name < b.name; });
    return out;
  }

  Status CheckAccess(const CallContext& ctx) override {
    if (auto s = ctx.Check("checking " + root_); !s.ok()) return s;
    std::error_code ec;
    fs::create_directories(root_, ec);
    if (ec) return ErrnoToStatus(ec.value(), "creating " + root_);
    if (access(root_.c_str(), W_OK) != 0) return ErrnoToStatus(errno, root_);
    return OkStatus();
  }

  Status Delete(const std::string& name, const Precondition& pre, const CallContext& ctx) override {
    if (auto s = ctx.Check("deleting " + Path(name)); !s.ok()) return s;
    auto lock = Lock();
    if (!lock.ok()) return lock.status();
    struct stat st {};
    if (stat(Path(name).c_str(), &st) != 0) return errno == ENOENT ? OkStatus() : ErrnoToStatus(errno, Path(name));
    if (pre.if_generation_match && *pre.if_generation_match != Generation(st)) {
      return FailedPreconditionError(fmt::format("{}/{}: precondition failed: the object changed", Describe(), name));
    }
    if (unlink(Path(name).c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "deleting " + Path(name));
    return OkStatus();
  }

 private:
  std::string Path(const std::string& name) const { return root_ + "/" + name; }

  // Held while a precondition is checked and the object replaced.
  StatusOr<std::shared_ptr<Fd>> Lock() {
    std::error_code ec;
    fs::create_directories(root_, ec);
    auto fd = std::make_shared<Fd>(open((root_ + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (fd->fd < 0) return ErrnoToStatus(errno, "locking " + root_);
    if (flock(fd->fd, LOCK_EX) != 0) return ErrnoToStatus(errno, "locking " + root_);
    return fd;
  }

  template <typename Fill>
  StatusOr<ObjectInfo> Write(const std::string& name, const Precondition& pre, Fill fill) {
    auto target = Path(name);
    std::error_code ec;
    fs::create_directories(fs::path(target).parent_path(), ec);
    if (ec) return ErrnoToStatus(ec.value(), "creating the directory of " + target);
    auto tmp = fmt::format("{}.spotvisor-tmp.{}", target, getpid());
    ObjectInfo o{name, 0, 0, 0};
    {
      Fd out(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (out.fd < 0) return ErrnoToStatus(errno, "creating " + tmp);
      if (auto s = fill(out.fd, o.crc32c, o.size); !s.ok()) {
        unlink(tmp.c_str());
        return s;
      }
      if (fsync(out.fd) != 0) return ErrnoToStatus(errno, "flushing " + tmp);
    }
    auto lock = Lock();
    if (!lock.ok()) return lock.status();
    struct stat st {};
    bool exists = stat(target.c_str(), &st) == 0;
    if (pre.if_generation_match && *pre.if_generation_match != (exists ? Generation(st) : 0)) {
      unlink(tmp.c_str());
      return FailedPreconditionError(fmt::format("{}/{}: precondition failed: the object changed", Describe(), name));
    }
    if (rename(tmp.c_str(), target.c_str()) != 0) return ErrnoToStatus(errno, "renaming " + tmp);
    if (stat(target.c_str(), &st) != 0) return ErrnoToStatus(errno, target);
    o.generation = Generation(st);
    return o;
  }

  std::string root_;
};

}  // namespace

std::unique_ptr<ObjectStore> MakeFileObjectStore(const std::string& root) {
  return std::make_unique<FileObjectStore>(root);
}

}  // namespace spotvisor
