#include "state/status_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace spotvisor {

std::string StatusFilePath(const std::string& state_dir) { return state_dir + "/status.json"; }

Status WriteFileAtomically(const std::string& path, const std::string& contents, bool durable) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "creating " + tmp);
  std::size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoToStatus(err, "writing " + tmp);
    }
    done += static_cast<std::size_t>(n);
  }
  if ((durable && fsync(fd) != 0) || close(fd) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return ErrnoToStatus(err, "flushing " + tmp);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return ErrnoToStatus(err, "renaming " + tmp + " to " + path);
  }
  return OkStatus();
}

Status WriteStatusFile(const std::string& state_dir, const nlohmann::json& status) {
  return WriteFileAtomically(StatusFilePath(state_dir), status.dump(2) + "\n", /*durable=*/false);
}

StatusOr<nlohmann::json> ReadStatusFile(const std::string& state_dir) {
  auto path = StatusFilePath(state_dir);
  std::ifstream in(path);
  if (!in) return ErrnoToStatus(errno, path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return InternalError(path + ": not valid JSON");
  return j;
}

}  // namespace spotvisor
