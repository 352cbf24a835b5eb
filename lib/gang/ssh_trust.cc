#include "gang/ssh_trust.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/random.h"
#include "common/strings.h"
#include "storage/crc32c.h"

namespace spotvisor {
namespace {

constexpr std::size_t kMaxPublicKeyLine = 1024;
constexpr std::size_t kMaxComment = 256;
constexpr std::size_t kMaxTag = 200;
constexpr std::size_t kMaxKeyName = 128;
constexpr std::size_t kMaxAuthorizedKeys = 1 << 20;
constexpr std::size_t kMaxPublicKeyFile = 4096;
constexpr auto kKeygenCap = std::chrono::seconds(60);
constexpr std::string_view kKeyType = "ssh-ed25519";
// The ssh wire format of an ed25519 public key: string "ssh-ed25519", string of 32 bytes.
constexpr std::string_view kWirePrefix{"\0\0\0\x0bssh-ed25519\0\0\0\x20", 19};
constexpr std::size_t kWireSize = kWirePrefix.size() + 32;
constexpr const char* kAuthorizedKeys = "authorized_keys";

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// Bytes from outside, safe to put into a message: printable ASCII stays,
// everything else (and " and \) becomes \xNN; at most `max` input bytes.
std::string Shown(std::string_view s, std::size_t max = 48) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

bool IsTokenChar(char c, std::string_view extra) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         extra.find(c) != std::string_view::npos;
}

// Strict RFC 4648 base64: padded, canonical (the bits padding drops are
// zero), no whitespace. nullopt when it is not. Canonical by construction:
// the text must be exactly what encoding the decoded bytes gives back.
std::optional<std::string> DecodeBase64(std::string_view s) {
  if (s.empty()) return std::nullopt;
  auto bytes = Base64Decode(s);
  if (!bytes.ok() || Base64Encode(*bytes) != s) return std::nullopt;
  return *std::move(bytes);
}

Status CheckComment(std::string_view comment, const std::string& where) {
  if (comment.empty() || comment.size() > kMaxComment) {
    return InvalidArgumentError(
        fmt::format("{}: the comment is {} bytes; it must be 1-{}", where, comment.size(), kMaxComment));
  }
  for (std::size_t i = 0; i < comment.size(); ++i) {
    auto c = static_cast<unsigned char>(comment[i]);
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\'' || c == '\\' || c == '`') {
      return InvalidArgumentError(fmt::format(
          "{}: the comment has byte 0x{:02x} at offset {}; only printable ASCII without quotes or backslashes", where,
          c, i));
    }
  }
  return OkStatus();
}

// The IP as sshd matches `from=` against it: inet_ntop's form, an
// IPv4-mapped IPv6 address as IPv4 (sshd unmaps the client's address).
StatusOr<std::string> NormaliseIp(const std::string& ip) {
  auto bad = [&] {
    return InvalidArgumentError(fmt::format("\"{}\" is not an IPv4 or IPv6 address literal", Shown(ip)));
  };
  if (ip.empty() || ip.size() >= INET6_ADDRSTRLEN) return bad();
  for (char c : ip) {
    bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!hex && c != '.' && c != ':') return bad();
  }
  char buf[INET6_ADDRSTRLEN];
  in_addr a4{};
  if (inet_pton(AF_INET, ip.c_str(), &a4) == 1) {
    if (inet_ntop(AF_INET, &a4, buf, sizeof buf) == nullptr) return bad();
    return std::string(buf);
  }
  in6_addr a6{};
  if (inet_pton(AF_INET6, ip.c_str(), &a6) != 1) return bad();
  if (IN6_IS_ADDR_V4MAPPED(&a6)) {
    std::memcpy(&a4, a6.s6_addr + 12, 4);
    if (inet_ntop(AF_INET, &a4, buf, sizeof buf) == nullptr) return bad();
  } else if (inet_ntop(AF_INET6, &a6, buf, sizeof buf) == nullptr) {
    return bad();
  }
  return std::string(buf);
}

std::string_view LastField(std::string_view line) {
  auto end = line.find_last_not_of(" \t\r");
  if (end == std::string_view::npos) return {};
  line = line.substr(0, end + 1);
  auto start = line.find_last_of(" \t");
  return start == std::string_view::npos ? line : line.substr(start + 1);
}

bool IsCommentOrBlank(std::string_view line) {
  auto first = line.find_first_not_of(" \t\r");
  return first == std::string_view::npos || line[first] == '#';
}

// Lines with their '\n' (the last may have none): rejoined they are the input.
std::vector<std::string_view> LinesKeepingEnds(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::size_t len = nl == std::string_view::npos ? text.size() : nl + 1;
    lines.push_back(text.substr(0, len));
    text.remove_prefix(len);
  }
  return lines;
}

std::string_view WithoutEnd(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  return line;
}

StatusOr<std::string> ReadAll(int fd, std::size_t max, const std::string& what) {
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "reading " + what);
    if (n == 0) return out;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > max) return FailedPreconditionError(fmt::format("{} is larger than {} bytes", what, max));
  }
}

Status WriteAll(int fd, std::string_view data, const std::string& what) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "writing " + what);
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return OkStatus();
}

// ---- the key pair ----

Status CheckKeyName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= kMaxKeyName && name != "." && name != "..";
  for (char c : name) ok = ok && IsTokenChar(c, "._-");
  if (ok) return OkStatus();
  return InvalidArgumentError(
      fmt::format("\"{}\" is not a key name (1-{} of A-Z a-z 0-9 . _ -)", Shown(name), kMaxKeyName));
}

// DIR, opened without following a symlink there, a directory of owner's, 0700.
StatusOr<UniqueFd> PrepareKeyDir(const std::string& dir, const UserInfo& owner) {
  bool created = mkdir(dir.c_str(), 0700) == 0;
  if (!created && errno != EEXIST) return ErrnoToStatus(errno, fmt::format("creating the key directory {}", dir));
  UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ELOOP || errno == ENOTDIR) {
      return FailedPreconditionError(fmt::format("the key directory {} is a symlink or not a directory", dir));
    }
    return ErrnoToStatus(errno, fmt::format("opening the key directory {}", dir));
  }
  if (created && fchown(fd.get(), owner.uid, owner.gid) != 0) {
    return ErrnoToStatus(errno, fmt::format("giving the key directory {} to uid {}", dir, owner.uid));
  }
  struct stat st{};
  if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "stat " + dir);
  if (st.st_uid != owner.uid) {
    return FailedPreconditionError(fmt::format("the key directory {} belongs to uid {}, not to uid {} ({})", dir,
                                               st.st_uid, owner.uid, owner.name));
  }
  if (fchmod(fd.get(), 0700) != 0) return ErrnoToStatus(errno, "chmod 0700 " + dir);
  return fd;
}

Status RemoveIfPresent(int dirfd, const std::string& name, const std::string& dir) {
  if (unlinkat(dirfd, name.c_str(), 0) == 0 || errno == ENOENT) return OkStatus();
  return ErrnoToStatus(errno, fmt::format("removing the old key {}/{}", dir, name));
}

// A file ssh-keygen (running as owner) left in DIR: a regular file of
// owner's with one link, opened without following a symlink.
StatusOr<UniqueFd> OpenKeyFile(int dirfd, const std::string& name, const std::string& dir, const UserInfo& owner) {
  std::string path = dir + "/" + name;
  UniqueFd fd(openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ELOOP) return FailedPreconditionError(fmt::format("{} is a symlink; refusing it", path));
    return ErrnoToStatus(errno, "opening " + path);
  }
  struct stat st{};
  if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != owner.uid) {
    return FailedPreconditionError(fmt::format(
        "{} is not a regular file of uid {} with one link (mode {:o}, uid {}, {} links); refusing it", path,
        owner.uid, st.st_mode, st.st_uid, st.st_nlink));
  }
  return fd;
}

StatusOr<std::string> FinishKeyFiles(int dirfd, const std::string& dir, const std::string& name,
                                     const UserInfo& owner) {
  auto priv = OpenKeyFile(dirfd, name, dir, owner);
  if (!priv.ok()) return priv.status();
  if (fchown(priv->get(), owner.uid, owner.gid) != 0 || fchmod(priv->get(), 0600) != 0) {
    return ErrnoToStatus(errno, fmt::format("making {}/{} 0600 for uid {}", dir, name, owner.uid));
  }
  auto pub = OpenKeyFile(dirfd, name + ".pub", dir, owner);
  if (!pub.ok()) return pub.status();
  auto text = ReadAll(pub->get(), kMaxPublicKeyFile, dir + "/" + name + ".pub");
  if (!text.ok()) return text.status();
  std::string_view line = *text;
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  auto key = ParseEd25519PublicKey(line);
  if (!key.ok()) {
    return InternalError(fmt::format("ssh-keygen wrote {}/{}.pub, but {}", dir, name, key.status().message()));
  }
  return *key;
}

Status RunKeygen(const std::string& ssh_keygen, const std::string& path, const std::string& comment,
                 const UserInfo& owner, ChildRegistry& children, const CallContext& ctx) {
  SpawnOptions o;
  o.argv = {ssh_keygen, "-t", "ed25519", "-N", "", "-q", "-C", comment, "-f", path};
  o.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"};
  if (owner.uid != geteuid() || owner.gid != getegid()) o.user = owner;
  std::atomic<bool> cancelled{false};
  std::uint64_t subscription = 0;
  if (ctx.cancel) subscription = ctx.cancel->Subscribe([&cancelled] { cancelled = true; });
  std::string output;
  auto r = children.Run(o, ctx.Remaining(kKeygenCap), &output, ctx.cancel ? &cancelled : nullptr);
  if (ctx.cancel) ctx.cancel->Unsubscribe(subscription);
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kNotFound) {
      return NotFoundError(fmt::format("{} (install openssh-client: apt-get install openssh-client)",
                                       r.status().message()));
    }
    return r.status();
  }
  if (WIFEXITED(*r) && WEXITSTATUS(*r) == 0) return OkStatus();
  auto shown = Shown(output.substr(0, output.find_last_not_of(" \n") + 1), 300);
  return InternalError(
      fmt::format("{} {}: {}", ssh_keygen, DescribeWaitStatus(*r), shown.empty() ? "(no output)" : shown));
}

// ---- authorized_keys ----

// One writer at a time: every edit reads, changes and replaces the file.
std::mutex& AuthorizedKeysMutex() {
  static std::mutex mu;
  return mu;
}

std::string SshDirOf(const UserInfo& user) { return user.home + "/.ssh"; }

// ~/.ssh, opened without following a symlink there; nullopt when it is
// missing and !create. HOME itself is the administrator's (passwd).
StatusOr<std::optional<UniqueFd>> OpenSshDir(const UserInfo& user, bool create) {
  std::string ssh_dir = SshDirOf(user);
  if (user.home.empty() || user.home[0] != '/') {
    return InvalidArgumentError(fmt::format("user {} has no absolute home directory (\"{}\")", user.name,
                                            Shown(user.home)));
  }
  UniqueFd home(open(user.home.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (home.get() < 0) return ErrnoToStatus(errno, fmt::format("opening the home directory of {}", user.name));
  for (int attempt = 0; attempt < 2; ++attempt) {
    UniqueFd fd(openat(home.get(), ".ssh", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() >= 0) {
      struct stat st{};
      if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "stat " + ssh_dir);
      if (st.st_uid != user.uid && st.st_uid != 0) {
        return FailedPreconditionError(
            fmt::format("{} belongs to uid {}, neither {} nor root; refusing it", ssh_dir, st.st_uid, user.name));
      }
      return std::optional<UniqueFd>(std::move(fd));
    }
    if (errno == ELOOP || errno == ENOTDIR) {
      return FailedPreconditionError(fmt::format(
          "{} is a symlink or not a directory; refusing to follow it (it could point at a file of root's)", ssh_dir));
    }
    if (errno != ENOENT) return ErrnoToStatus(errno, "opening " + ssh_dir);
    if (!create) return std::optional<UniqueFd>();
    if (mkdirat(home.get(), ".ssh", 0700) != 0) {
      if (errno == EEXIST) continue;  // made meanwhile: open what is there now
      return ErrnoToStatus(errno, "creating " + ssh_dir);
    }
    UniqueFd made(openat(home.get(), ".ssh", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (made.get() < 0) return ErrnoToStatus(errno, "opening " + ssh_dir + " just created");
    if (fchown(made.get(), user.uid, user.gid) != 0 || fchmod(made.get(), 0700) != 0) {
      return ErrnoToStatus(errno, fmt::format("giving {} to {} (0700)", ssh_dir, user.name));
    }
    return std::optional<UniqueFd>(std::move(made));
  }
  return UnavailableError(ssh_dir + " keeps appearing and disappearing; try again");
}

struct KeysFile {
  std::string text;
  uid_t uid;
  gid_t gid;
  mode_t mode;
};

// authorized_keys as it is, or nullopt when there is none.
StatusOr<std::optional<KeysFile>> ReadAuthorizedKeys(int ssh_fd, const UserInfo& user) {
  std::string path = SshDirOf(user) + "/" + kAuthorizedKeys;
  UniqueFd fd(openat(ssh_fd, kAuthorizedKeys, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return std::optional<KeysFile>();
    if (errno == ELOOP) {
      return FailedPreconditionError(
          fmt::format("{} is a symlink; refusing to follow it (it could point at a file of root's)", path));
    }
    return ErrnoToStatus(errno, "opening " + path);
  }
  struct stat st{};
  if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return FailedPreconditionError(path + " is not a regular file; refusing it");
  if (st.st_nlink != 1) {
    return FailedPreconditionError(
        fmt::format("{} has {} hard links; refusing it (it could be another file's)", path, st.st_nlink));
  }
  if (st.st_uid != user.uid && st.st_uid != 0) {
    return FailedPreconditionError(
        fmt::format("{} belongs to uid {}, neither {} nor root; refusing it", path, st.st_uid, user.name));
  }
  auto text = ReadAll(fd.get(), kMaxAuthorizedKeys, path);
  if (!text.ok()) return text.status();
  return std::optional<KeysFile>(KeysFile{std::move(*text), st.st_uid, st.st_gid, st.st_mode & 0644});
}

// Temp file in ~/.ssh, fsync, rename over authorized_keys, fsync ~/.ssh.
Status ReplaceAuthorizedKeys(int ssh_fd, const UserInfo& user, const KeysFile& file) {
  std::string path = SshDirOf(user) + "/" + kAuthorizedKeys;
  std::string tmp;
  UniqueFd fd;
  for (int attempt = 0; attempt < 3 && fd.get() < 0; ++attempt) {
    tmp = fmt::format(".{}.spotvisor-{}-{:016x}", kAuthorizedKeys, getpid(), RandomSeed());
    fd = UniqueFd(openat(ssh_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd.get() < 0 && errno != EEXIST) break;
  }
  if (fd.get() < 0) return ErrnoToStatus(errno, fmt::format("creating a temporary file in {}", SshDirOf(user)));
  Status s = WriteAll(fd.get(), file.text, tmp);
  if (s.ok() && (fchown(fd.get(), file.uid, file.gid) != 0 || fchmod(fd.get(), file.mode) != 0)) {
    s = ErrnoToStatus(errno, fmt::format("giving the new {} to uid {} (mode {:o})", path, file.uid, file.mode));
  }
  if (s.ok() && fsync(fd.get()) != 0) s = ErrnoToStatus(errno, "fsync of the new " + path);
  fd.Reset();
  if (s.ok() && renameat(ssh_fd, tmp.c_str(), ssh_fd, kAuthorizedKeys) != 0) {
    s = ErrnoToStatus(errno, "renaming the new " + path + " into place");
  }
  if (!s.ok()) {
    unlinkat(ssh_fd, tmp.c_str(), 0);
    return s;
  }
  if (fsync(ssh_fd) != 0) return ErrnoToStatus(errno, "fsync of " + SshDirOf(user));
  return OkStatus();
}

}  // namespace

StatusOr<std::string> ParseEd25519PublicKey(std::string_view line) {
  auto bad = [](const std::string& why) { return InvalidArgumentError("public key: " + why); };
  if (line.size() > kMaxPublicKeyLine) {
    return bad(fmt::format("the line is {} bytes, longer than {}", line.size(), kMaxPublicKeyLine));
  }
  for (std::size_t i = 0; i < line.size(); ++i) {
    auto c = static_cast<unsigned char>(line[i]);
    if (c < 0x20 || c >= 0x7f) {
      return bad(fmt::format("byte 0x{:02x} at offset {} (a newline, control character or non-ASCII byte)", c, i));
    }
  }
  auto sp = line.find(' ');
  std::string_view type = line.substr(0, sp);
  if (type != kKeyType) {
    return bad(fmt::format("the key type is \"{}\", not ssh-ed25519 (want \"ssh-ed25519 BASE64 [COMMENT]\")",
                           Shown(type, 40)));
  }
  if (sp == std::string_view::npos) return bad("no key after \"ssh-ed25519\"");
  std::string_view rest = line.substr(sp + 1);
  auto sp2 = rest.find(' ');
  std::string_view b64 = rest.substr(0, sp2);
  std::optional<std::string_view> comment;
  if (sp2 != std::string_view::npos) comment = rest.substr(sp2 + 1);
  if (b64.empty()) return bad("the key field is empty (one space between fields)");
  auto blob = DecodeBase64(b64);
  if (!blob) return bad(fmt::format("the key (\"{}\") is not valid base64", Shown(b64, 24)));
  if (blob->size() != kWireSize) {
    return bad(fmt::format("the key decodes to {} bytes; an ssh-ed25519 key is {} (the string \"ssh-ed25519\", "
                           "then a 32-byte key)",
                           blob->size(), kWireSize));
  }
  if (std::string_view(*blob).substr(0, kWirePrefix.size()) != kWirePrefix) {
    return bad(fmt::format("the key's wire format does not start with the string \"ssh-ed25519\" and a 32-byte "
                           "length (it starts \"{}\")",
                           Shown(std::string_view(*blob).substr(0, kWirePrefix.size()))));
  }
  std::string out = fmt::format("{} {}", kKeyType, b64);
  if (comment) {
    if (auto s = CheckComment(*comment, "public key"); !s.ok()) return s;
    out += " ";
    out += *comment;
  }
  return out;
}

Status CheckKeyTag(std::string_view tag) {
  bool ok = !tag.empty() && tag.size() <= kMaxTag;
  for (char c : tag) ok = ok && IsTokenChar(c, "._:-");
  if (ok) return OkStatus();
  return InvalidArgumentError(
      fmt::format("\"{}\" is not an authorized_keys tag (1-{} of A-Z a-z 0-9 . _ : -)", Shown(tag), kMaxTag));
}

StatusOr<SshKeyPair> GenerateKeyPair(const std::string& dir, const std::string& name, const std::string& comment,
                                     const UserInfo& owner, ChildRegistry& children, const CallContext& ctx,
                                     const std::string& ssh_keygen) {
  if (dir.empty() || dir[0] != '/') {
    return InvalidArgumentError(fmt::format("the key directory \"{}\" is not an absolute path", Shown(dir)));
  }
  if (auto s = CheckKeyName(name); !s.ok()) return s;
  if (auto s = CheckComment(comment, "ssh key " + name); !s.ok()) return s;
  const std::string what = fmt::format("generating the ssh key {}/{}", dir, name);
  if (auto s = ctx.Check(what); !s.ok()) return s;
  auto dir_fd = PrepareKeyDir(dir, owner);
  if (!dir_fd.ok()) return dir_fd.status();
  for (auto const& file : {name, name + ".pub"}) {
    if (auto s = RemoveIfPresent(dir_fd->get(), file, dir); !s.ok()) return s;
  }
  auto cleanup = [&] {
    unlinkat(dir_fd->get(), name.c_str(), 0);
    unlinkat(dir_fd->get(), (name + ".pub").c_str(), 0);
  };
  if (auto s = RunKeygen(ssh_keygen, dir + "/" + name, comment, owner, children, ctx); !s.ok()) {
    cleanup();
    return Status(s.code(), fmt::format("{}: {}", what, s.message()));
  }
  auto public_key = FinishKeyFiles(dir_fd->get(), dir, name, owner);
  if (!public_key.ok()) {
    cleanup();
    return Status(public_key.status().code(), fmt::format("{}: {}", what, public_key.status().message()));
  }
  return SshKeyPair{dir + "/" + name, std::move(*public_key)};
}

Status AuthorizeKey(const UserInfo& user, const std::string& from_ip, std::string_view public_key_line,
                    const std::string& tag) {
  auto ip = NormaliseIp(from_ip);
  if (!ip.ok()) return ip.status();
  auto key = ParseEd25519PublicKey(public_key_line);
  if (!key.ok()) return key.status();
  if (auto s = CheckKeyTag(tag); !s.ok()) return s;
  std::string_view type_and_key = *key;
  type_and_key = type_and_key.substr(0, type_and_key.find(' ', kKeyType.size() + 1));
  std::string entry = fmt::format("from=\"{}\",restrict {} {}\n", *ip, type_and_key, tag);

  std::lock_guard lock(AuthorizedKeysMutex());
  auto ssh_dir = OpenSshDir(user, /*create=*/true);
  if (!ssh_dir.ok()) return ssh_dir.status();
  int ssh_fd = (*ssh_dir)->get();
  auto old = ReadAuthorizedKeys(ssh_fd, user);
  if (!old.ok()) return old.status();
  KeysFile file = old->value_or(KeysFile{"", user.uid, user.gid, 0600});
  std::string text;
  bool placed = false;
  for (auto line : LinesKeepingEnds(file.text)) {
    std::string_view bare = WithoutEnd(line);
    if (IsCommentOrBlank(bare) || LastField(bare) != tag) {
      text += line;
    } else if (!placed) {
      text += entry;
      placed = true;
    }
  }
  if (!placed) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += entry;
  }
  if (*old && text == file.text) return OkStatus();
  file.text = std::move(text);
  return ReplaceAuthorizedKeys(ssh_fd, user, file);
}

StatusOr<int> RevokeKeys(const UserInfo& user, const std::string& tag, bool prefix) {
  if (auto s = CheckKeyTag(tag); !s.ok()) return s;
  std::lock_guard lock(AuthorizedKeysMutex());
  auto ssh_dir = OpenSshDir(user, /*create=*/false);
  if (!ssh_dir.ok()) return ssh_dir.status();
  if (!*ssh_dir) return 0;
  int ssh_fd = (*ssh_dir)->get();
  auto old = ReadAuthorizedKeys(ssh_fd, user);
  if (!old.ok()) return old.status();
  if (!*old) return 0;
  KeysFile file = std::move(**old);
  std::string text;
  int removed = 0;
  for (auto line : LinesKeepingEnds(file.text)) {
    std::string_view bare = WithoutEnd(line);
    std::string_view last = LastField(bare);
    bool match = !IsCommentOrBlank(bare) && (prefix ? StartsWith(last, tag) : last == tag);
    if (match) {
      ++removed;
    } else {
      text += line;
    }
  }
  if (removed == 0) return 0;
  file.text = std::move(text);
  if (auto s = ReplaceAuthorizedKeys(ssh_fd, user, file); !s.ok()) return s;
  return removed;
}

}  // namespace spotvisor
