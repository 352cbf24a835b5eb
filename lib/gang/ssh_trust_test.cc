#include "gang/ssh_trust.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

#include "common/clock.h"
#include "process/spawn.h"
#include "testing/files.h"

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

constexpr uid_t kTestUid = 65534;  // nobody: ssh-keygen refuses a uid without a passwd entry
constexpr const char* kKeyA = "AAAAC3NzaC1lZDI1NTE5AAAAIHON/IYHmpBUwc8Tf3sDIDj9cfijaxLTtawDBNzmT8Mq";
constexpr const char* kKeyB = "AAAAC3NzaC1lZDI1NTE5AAAAIANDmrXnErMnTG62BH+GyB/KhBm/LgACP+5rXEPFrXL5";

struct TempDir {
  TempDir() {
    char t[] = "/tmp/spotvisor-ssh-trust-XXXXXX";
    path = mkdtemp(t);
    chmod(path.c_str(), 0711);  // the test user must reach what is inside
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

using testfiles::Read;

void Write(const std::string& path, const std::string& text, mode_t mode = 0644) {
  std::ofstream(path, std::ios::binary) << text;
  chmod(path.c_str(), mode);
}

struct stat Lstat(const std::string& path) {
  struct stat st{};
  REQUIRE(lstat(path.c_str(), &st) == 0);
  return st;
}

bool Exists(const std::string& path) {
  struct stat st{};
  return lstat(path.c_str(), &st) == 0;
}

bool Root() {
  if (geteuid() == 0) return true;
  WARN("not running as root: this test needs to chown files to uid 65534; skipped");
  return false;
}

UserInfo TestUser(const std::string& home) {
  auto u = LookupUser("nobody");
  UserInfo user = u.ok() ? *u : UserInfo{"nobody", kTestUid, kTestUid, "", "", {}};
  REQUIRE(user.uid == kTestUid);
  user.home = home;
  user.groups.clear();
  return user;
}

UserInfo Me() { return UserInfo{"me", geteuid(), getegid(), "/", "", {}}; }

// A home directory of the test user's, with or without ~/.ssh.
std::string MakeHome(const TempDir& t, const UserInfo& user, bool with_ssh_dir) {
  std::string home = t.path + "/home";
  REQUIRE(mkdir(home.c_str(), 0755) == 0);
  REQUIRE(chown(home.c_str(), user.uid, user.gid) == 0);
  if (with_ssh_dir) {
    REQUIRE(mkdir((home + "/.ssh").c_str(), 0700) == 0);
    REQUIRE(chown((home + "/.ssh").c_str(), user.uid, user.gid) == 0);
  }
  return home;
}

std::string FindSshKeygen() {
  for (const char* p : {"/usr/bin/ssh-keygen", "/bin/ssh-keygen", "/usr/local/bin/ssh-keygen"}) {
    if (access(p, X_OK) == 0) return p;
  }
  WARN("ssh-keygen is not installed (apt-get install openssh-client): the real-ssh-keygen test is skipped");
  return "";
}

// Runs a command to completion; its exit code and output.
std::pair<int, std::string> RunCommand(const std::vector<std::string>& argv) {
  ChildRegistry reg;
  SpawnOptions o;
  o.argv = argv;
  o.env = {"PATH=/usr/bin:/bin"};
  std::string out;
  auto r = reg.Run(o, 30s, &out);
  REQUIRE(r.ok());
  REQUIRE(WIFEXITED(*r));
  return {WEXITSTATUS(*r), out};
}

// (fingerprint, comment) of every key `ssh-keygen -l -f FILE` finds in FILE.
std::vector<std::pair<std::string, std::string>> Fingerprints(const std::string& ssh_keygen, const std::string& file) {
  auto [code, out] = RunCommand({ssh_keygen, "-l", "-f", file});
  INFO(out);
  REQUIRE(code == 0);
  std::vector<std::pair<std::string, std::string>> prints;
  std::istringstream in(out);
  std::string bits, fp, comment, type;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    if (fields >> bits >> fp >> comment >> type) prints.emplace_back(fp, comment);
  }
  return prints;
}

// A stand-in for ssh-keygen: a shell script; "$f" is the -f argument.
std::string StandIn(const TempDir& t, const std::string& body) {
  std::string path = t.path + "/fake-ssh-keygen";
  Write(path, "#!/bin/sh\nfor a; do f=$a; done\n" + body + "\n", 0755);
  return path;
}

bool AllPrintable(const std::string& s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

std::string Base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    unsigned n = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                 static_cast<unsigned char>(bytes[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += kAlphabet[(n >> k) & 63];
  }
  if (i + 1 == bytes.size()) {
    unsigned n = static_cast<unsigned char>(bytes[i]) << 16;
    out += std::string{kAlphabet[(n >> 18) & 63], kAlphabet[(n >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    unsigned n = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += std::string{kAlphabet[(n >> 18) & 63], kAlphabet[(n >> 12) & 63], kAlphabet[(n >> 6) & 63], '='};
  }
  return out;
}

std::string Wire(const std::string& type, std::size_t key_len_field, std::size_t key_bytes) {
  auto u32 = [](std::size_t n) {
    return std::string{static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                       static_cast<char>(n)};
  };
  return u32(type.size()) + type + u32(key_len_field) + std::string(key_bytes, '\x42');
}

// Our children, zombies included: what a killed-but-not-reaped ssh-keygen would be.
std::vector<pid_t> LiveChildren() { return ListChildren(); }

// ---- ParseEd25519PublicKey ----

TEST_CASE("a well-formed ed25519 public key line comes back rebuilt from its fields") {
  std::string key = std::string("ssh-ed25519 ") + kKeyA;
  CHECK(*ParseEd25519PublicKey(key) == key);
  CHECK(*ParseEd25519PublicKey(key + " root@leader") == key + " root@leader");
  CHECK(*ParseEd25519PublicKey(key + " spotvisor gang g gen 3") == key + " spotvisor gang g gen 3");
  // Built from the wire format by hand: the check is the format, not one known key.
  CHECK(ParseEd25519PublicKey("ssh-ed25519 " + Base64(Wire("ssh-ed25519", 32, 32))).ok());
}

TEST_CASE("public key lines with something smuggled in, the wrong type or a broken key are refused") {
  std::string key = std::string("ssh-ed25519 ") + kKeyA;
  struct Case {
    std::string line;
    std::string why;
  };
  std::vector<Case> cases = {
      {"", "key type"},
      {"ssh-ed25519", "no key"},
      {key + "\ncommand=\"/bin/sh\" " + key, "byte 0x0a"},
      {key + " x\ncommand=\"/bin/sh\" " + key + " y", "byte 0x0a"},
      {key + "\r", "byte 0x0d"},
      {key + "\n", "byte 0x0a"},
      {std::string(key + " a").append(1, '\0').append("b"), "byte 0x00"},
      {key + " caf\xc3\xa9", "byte 0xc3"},
      {"command=\"/bin/sh\" " + key, "not ssh-ed25519"},
      {"from=\"*\",no-pty " + key, "not ssh-ed25519"},
      {"restrict " + key, "not ssh-ed25519"},
      {key + " command=\"/bin/sh\"", "without quotes"},
      {key + " it's", "without quotes"},
      {key + " back\\slash", "without quotes"},
      {"ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 rsa@host", "not ssh-ed25519"},
      {"ssh-ed25519-cert-v01@openssh.com " + std::string(kKeyA), "not ssh-ed25519"},
      {"ssh-dss " + std::string(kKeyA), "not ssh-ed25519"},
      {"ssh-ed25519\t" + std::string(kKeyA), "byte 0x09"},
      {"ssh-ed25519  " + std::string(kKeyA), "empty"},
      {key + " ", "comment is 0 bytes"},
      {key + " " + std::string(257, 'c'), "comment is 257 bytes"},
      {key + " " + std::string(1100, 'c'), "longer than 1024"},
      {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHON/IYHmpBUwc8Tf3sDIDj9cfijaxLTtawDBNzmT8M", "not valid base64"},
      {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHON/IYHmpBUwc8Tf3sDIDj9cfijaxLTtawDBNzmT8M$", "not valid base64"},
      {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHON/IYHmpBUw=8Tf3sDIDj9cfijaxLTtawDBNzmT8Mq", "not valid base64"},
      {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHON/IYHmpBUwc8Tf3sDIDj9cfijaxLTtawDBNzmT8Mq====", "not valid base64"},
      {"ssh-ed25519 " + Base64(Wire("ssh-ed25519", 32, 32)).substr(0, 66) + "==", "not valid base64"},  // 4 bytes short
      {"ssh-ed25519 QR==", "not valid base64"},  // non-canonical: the bits padding drops are not zero
      {"ssh-ed25519 " + Base64(Wire("ssh-ed25519", 32, 31)), "decodes to 50 bytes"},
      {"ssh-ed25519 " + Base64(Wire("ssh-ed25519", 32, 33)), "decodes to 52 bytes"},
      {"ssh-ed25519 " + Base64(Wire("ssh-ed25519", 32, 64)), "decodes to 83 bytes"},
      {"ssh-ed25519 " + Base64(Wire("ssh-ed25519", 33, 32)), "wire format"},
      {"ssh-ed25519 " + Base64(Wire("ssh-ed25518", 32, 32)), "wire format"},
      {"ssh-ed25519 " + Base64(Wire("ssh-rsa", 32, 36)), "wire format"},
  };
  for (auto const& c : cases) {
    INFO("line: " << c.line);
    auto r = ParseEd25519PublicKey(c.line);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(c.why));
    CHECK(AllPrintable(r.status().message()));  // never the raw bytes
  }
}

TEST_CASE("tags are tokens of letters, digits and . _ : -, at most 200") {
  CHECK(CheckKeyTag("spotvisor-gang:resnet-lr3:17").ok());
  CHECK(CheckKeyTag(std::string(200, 't')).ok());
  for (std::string bad : {std::string(), std::string(201, 't'), std::string("a b"), std::string("a\nb"),
                          std::string("a/b"), std::string("a\"b"), std::string("a,b"), std::string("a*")}) {
    INFO(bad);
    auto s = CheckKeyTag(bad);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(AllPrintable(s.message()));
  }
}

// ---- GenerateKeyPair ----

TEST_CASE("GenerateKeyPair runs the real ssh-keygen as the key's user: 0600 key, 0700 dir, public key parsed back") {
  auto ssh_keygen = FindSshKeygen();
  if (ssh_keygen.empty() || !Root()) return;
  TempDir t;
  auto user = TestUser("/nonexistent");
  ChildRegistry reg;
  std::string dir = t.path + "/keys";
  auto pair = GenerateKeyPair(dir, "gang-key", "spotvisor-gang:g:1", user, reg, Background());
  REQUIRE(pair.ok());
  CHECK(pair->private_key_path == dir + "/gang-key");
  auto d = Lstat(dir);
  CHECK(S_ISDIR(d.st_mode));
  CHECK((d.st_mode & 07777) == 0700);
  CHECK(d.st_uid == kTestUid);
  auto k = Lstat(pair->private_key_path);
  CHECK(S_ISREG(k.st_mode));
  CHECK((k.st_mode & 07777) == 0600);
  CHECK(k.st_uid == kTestUid);
  CHECK(k.st_gid == user.gid);
  CHECK(ParseEd25519PublicKey(pair->public_key).ok());
  CHECK_THAT(pair->public_key, Catch::EndsWith(" spotvisor-gang:g:1"));
  // The private key is the public key's: ssh-keygen derives the same public key from it.
  auto [code, derived] = RunCommand({ssh_keygen, "-y", "-f", pair->private_key_path});
  REQUIRE(code == 0);
  auto key_of = [](const std::string& line) { return line.substr(0, line.find(' ', 12)); };
  CHECK(key_of(derived) == key_of(pair->public_key));

  // Again, same name: a fresh key replaces the old one (no "Overwrite (y/n)?").
  auto again = GenerateKeyPair(dir, "gang-key", "spotvisor-gang:g:2", user, reg, Background());
  REQUIRE(again.ok());
  CHECK(key_of(again->public_key) != key_of(pair->public_key));
  auto [code2, derived2] = RunCommand({ssh_keygen, "-y", "-f", again->private_key_path});
  REQUIRE(code2 == 0);
  CHECK(key_of(derived2) == key_of(again->public_key));
  CHECK(LiveChildren().empty());
}

TEST_CASE("GenerateKeyPair without ssh-keygen says to install openssh-client") {
  TempDir t;
  ChildRegistry reg;
  auto r = GenerateKeyPair(t.path + "/keys", "k", "c", Me(), reg, Background(), "/nonexistent/bin/ssh-keygen");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kNotFound);
  CHECK_THAT(r.status().message(), Catch::Contains("openssh-client"));
  // The child that failed to exec is left to the supervisor's reaper (spawn.h): be that reaper.
  for (pid_t pid : ListChildren()) waitpid(pid, nullptr, 0);
}

TEST_CASE("GenerateKeyPair with its deadline already passed starts nothing and fails with a deadline error") {
  TempDir t;
  ChildRegistry reg;
  SystemClock clock;
  CallContext ctx;
  ctx.clock = &clock;
  ctx.deadline = clock.Now() - 1s;
  std::string marker = t.path + "/ran";
  auto fake = StandIn(t, "touch " + marker + "; exec sleep 600");
  auto r = GenerateKeyPair(t.path + "/keys", "k", "c", Me(), reg, ctx, fake);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_FALSE(Exists(marker));
  CHECK_FALSE(Exists(t.path + "/keys/k"));
  CHECK(LiveChildren().empty());
  // And with the real program, when there is one: nothing is left of it either.
  if (auto ssh_keygen = FindSshKeygen(); !ssh_keygen.empty()) {
    auto real = GenerateKeyPair(t.path + "/keys", "k", "c", Me(), reg, ctx, ssh_keygen);
    CHECK(real.status().code() == StatusCode::kDeadlineExceeded);
    CHECK_FALSE(Exists(t.path + "/keys/k"));
    CHECK(LiveChildren().empty());
  }
}

TEST_CASE("GenerateKeyPair kills ssh-keygen when the deadline passes while it runs, and removes what it left") {
  TempDir t;
  ChildRegistry reg;
  SystemClock clock;
  CallContext ctx;
  ctx.clock = &clock;
  ctx.deadline = clock.Now() + 300ms;  // the code's own bound, as in children_test's Run case
  auto fake = StandIn(t, "echo half > \"$f\"; exec sleep 600");
  auto r = GenerateKeyPair(t.path + "/keys", "k", "c", Me(), reg, ctx, fake);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(r.status().message(), Catch::Contains("killed"));
  CHECK(LiveChildren().empty());  // killed and reaped
  CHECK_FALSE(Exists(t.path + "/keys/k"));
}

TEST_CASE("GenerateKeyPair kills ssh-keygen when the context is cancelled while it runs") {
  TempDir t;
  ChildRegistry reg;
  std::string fifo = t.path + "/started";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  auto fake = StandIn(t, "echo $$ > " + fifo + "; exec sleep 600");
  CallContext ctx;
  ctx.cancel = std::make_shared<CancelSource>();
  pid_t started = 0;
  // Cancels once the stand-in says it runs (bounded, in case it never does).
  std::thread canceller([&] {
    int fd = open(fifo.c_str(), O_RDWR | O_CLOEXEC);
    pollfd p{fd, POLLIN, 0};
    if (fd >= 0 && poll(&p, 1, 30000) == 1) {
      char buf[32] = {};
      if (read(fd, buf, sizeof buf - 1) > 0) started = static_cast<pid_t>(std::atoi(buf));
    }
    if (fd >= 0) close(fd);
    ctx.cancel->Cancel();
  });
  auto r = GenerateKeyPair(t.path + "/keys", "k", "c", Me(), reg, ctx, fake);
  canceller.join();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kCancelled);
  REQUIRE(started > 0);
  CHECK(kill(started, 0) == -1);
  CHECK(errno == ESRCH);
  CHECK(LiveChildren().empty());
}

TEST_CASE("GenerateKeyPair reports a failing ssh-keygen with its output escaped") {
  TempDir t;
  ChildRegistry reg;
  auto fake = StandIn(t, "printf 'Saving key failed: bad\\001byte\\n' >&2; exit 3");
  auto r = GenerateKeyPair(t.path + "/keys", "k", "c", Me(), reg, Background(), fake);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("exited with code 3"));
  CHECK_THAT(r.status().message(), Catch::Contains("Saving key failed: bad\\x01byte"));
  CHECK(AllPrintable(r.status().message()));
}

TEST_CASE("GenerateKeyPair does not follow a key file the user replaced with a symlink") {
  if (!Root()) return;
  TempDir t;
  ChildRegistry reg;
  auto user = TestUser("/nonexistent");
  std::string victim = t.path + "/root-owned";
  Write(victim, "root's secret\n", 0640);
  // What a trainer user could do in its own key directory while ssh-keygen runs.
  auto fake = StandIn(t, "ln -s " + victim + " \"$f\"; echo 'ssh-ed25519 " + std::string(kKeyA) + " c' > \"$f.pub\"");
  auto r = GenerateKeyPair(t.path + "/keys", "k", "c", user, reg, Background(), fake);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("symlink"));
  auto v = Lstat(victim);
  CHECK(v.st_uid == 0);  // not chown'ed to the user
  CHECK((v.st_mode & 07777) == 0640);
  CHECK(Read(victim) == "root's secret\n");
  CHECK_FALSE(Exists(t.path + "/keys/k"));  // the planted link is removed
}

TEST_CASE("GenerateKeyPair refuses a bad name or comment and a key directory that is a symlink or somebody else's") {
  TempDir t;
  ChildRegistry reg;
  auto fake = StandIn(t, "exit 0");
  CHECK(GenerateKeyPair(t.path + "/keys", "../k", "c", Me(), reg, Background(), fake).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(GenerateKeyPair(t.path + "/keys", "k", "a\"b", Me(), reg, Background(), fake).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(GenerateKeyPair("keys", "k", "c", Me(), reg, Background(), fake).status().code() ==
        StatusCode::kInvalidArgument);
  REQUIRE(mkdir((t.path + "/elsewhere").c_str(), 0755) == 0);
  REQUIRE(symlink((t.path + "/elsewhere").c_str(), (t.path + "/link").c_str()) == 0);
  auto linked = GenerateKeyPair(t.path + "/link", "k", "c", Me(), reg, Background(), fake);
  CHECK(linked.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(linked.status().message(), Catch::Contains("symlink"));
  CHECK((Lstat(t.path + "/elsewhere").st_mode & 07777) == 0755);  // not chmod'ed through the link
  if (!Root()) return;
  REQUIRE(mkdir((t.path + "/theirs").c_str(), 0755) == 0);
  REQUIRE(chown((t.path + "/theirs").c_str(), 12345, 12345) == 0);
  auto theirs = GenerateKeyPair(t.path + "/theirs", "k", "c", Me(), reg, Background(), fake);
  CHECK(theirs.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(theirs.status().message(), Catch::Contains("belongs to uid 12345"));
}

// ---- AuthorizeKey / RevokeKeys ----

TEST_CASE("AuthorizeKey creates ~/.ssh and authorized_keys for the user with one restricted line") {
  if (!Root()) return;
  TempDir t;
  auto user = TestUser("");
  user.home = MakeHome(t, user, /*with_ssh_dir=*/false);
  REQUIRE(AuthorizeKey(user, "10.128.0.7", std::string("ssh-ed25519 ") + kKeyA + " root@leader",
                       "spotvisor-gang:g:1")
              .ok());
  auto ssh = Lstat(user.home + "/.ssh");
  CHECK(S_ISDIR(ssh.st_mode));
  CHECK((ssh.st_mode & 07777) == 0700);
  CHECK(ssh.st_uid == kTestUid);
  auto ak = Lstat(user.home + "/.ssh/authorized_keys");
  CHECK(S_ISREG(ak.st_mode));
  CHECK((ak.st_mode & 07777) == 0600);
  CHECK(ak.st_uid == kTestUid);
  CHECK(ak.st_gid == user.gid);
  // The key's own comment is dropped: the tag names the line.
  CHECK(Read(user.home + "/.ssh/authorized_keys") ==
        std::string("from=\"10.128.0.7\",restrict ssh-ed25519 ") + kKeyA + " spotvisor-gang:g:1\n");
  // Nothing but the file itself is left in ~/.ssh (no temp files).
  CHECK(std::distance(std::filesystem::directory_iterator(user.home + "/.ssh"),
                      std::filesystem::directory_iterator()) == 1);
}

TEST_CASE("AuthorizeKey keeps every foreign line byte for byte and replaces its own tag's line") {
  if (!Root()) return;
  TempDir t;
  auto user = TestUser("");
  user.home = MakeHome(t, user, /*with_ssh_dir=*/true);
  std::string path = user.home + "/.ssh/authorized_keys";
  std::string a = std::string("ssh-ed25519 ") + kKeyA;
  std::string b = std::string("ssh-ed25519 ") + kKeyB;
  const std::string head =
      "# managed by hand\n"
      "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 alice@laptop\r\n"
      "\n"
      "  command=\"/usr/bin/backup\",no-pty " + a + " backup  \n"
      "# spotvisor-gang:g:1\n";
  const std::string old_line = "from=\"10.0.0.9\",restrict " + a + " spotvisor-gang:g:1\n";
  const std::string middle = "from=\"10.0.0.9\",restrict " + a + " spotvisor-gang:g:10\n";
  const std::string duplicate = "from=\"10.0.0.8\",restrict " + a + "\tspotvisor-gang:g:1  \n";
  const std::string tail = "ssh-ed25519 " + std::string(kKeyB) + " bob@no-newline";
  Write(path, head + old_line + middle + duplicate + tail, 0600);
  REQUIRE(chown(path.c_str(), kTestUid, user.gid) == 0);
  auto inode_before = Lstat(path).st_ino;

  REQUIRE(AuthorizeKey(user, "2001:DB8:0:0::1", b, "spotvisor-gang:g:1").ok());
  const std::string fresh = "from=\"2001:db8::1\",restrict " + b + " spotvisor-gang:g:1\n";
  CHECK(Read(path) == head + fresh + middle + tail);
  auto after = Lstat(path);
  CHECK(after.st_ino != inode_before);  // replaced by rename, not written in place
  CHECK((after.st_mode & 07777) == 0600);
  CHECK(after.st_uid == kTestUid);

  // A new tag goes at the end, the last line getting the newline it lacked.
  REQUIRE(AuthorizeKey(user, "::ffff:10.0.0.5", a, "spotvisor-gang:h:3").ok());
  const std::string appended = "from=\"10.0.0.5\",restrict " + a + " spotvisor-gang:h:3\n";
  CHECK(Read(path) == head + fresh + middle + tail + "\n" + appended);
  // The same call again changes nothing, not even the inode.
  auto inode = Lstat(path).st_ino;
  REQUIRE(AuthorizeKey(user, "10.0.0.5", a, "spotvisor-gang:h:3").ok());
  CHECK(Read(path) == head + fresh + middle + tail + "\n" + appended);
  CHECK(Lstat(path).st_ino == inode);
}

TEST_CASE("AuthorizeKey keeps a root-owned authorized_keys root's, without group or world write") {
  if (!Root()) return;
  TempDir t;
  auto user = TestUser("");
  user.home = MakeHome(t, user, /*with_ssh_dir=*/true);
  std::string path = user.home + "/.ssh/authorized_keys";
  Write(path, "# from config management\n", 0664);
  REQUIRE(AuthorizeKey(user, "10.0.0.1", std::string("ssh-ed25519 ") + kKeyA, "spotvisor-gang:g:1").ok());
  auto st = Lstat(path);
  CHECK(st.st_uid == 0);
  CHECK((st.st_mode & 07777) == 0644);
  CHECK_THAT(Read(path), Catch::StartsWith("# from config management\nfrom=\"10.0.0.1\""));
}

TEST_CASE("AuthorizeKey and RevokeKeys refuse a symlinked authorized_keys or ~/.ssh, a hard link, a stranger's file") {
  if (!Root()) return;
  TempDir t;
  auto user = TestUser("");
  std::string key = std::string("ssh-ed25519 ") + kKeyA;
  std::string victim = t.path + "/root-owned";
  Write(victim, "root's file\n", 0600);

  SECTION("authorized_keys is a symlink") {
    user.home = MakeHome(t, user, true);
    REQUIRE(symlink(victim.c_str(), (user.home + "/.ssh/authorized_keys").c_str()) == 0);
    auto s = AuthorizeKey(user, "10.0.0.1", key, "spotvisor-gang:g:1");
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(s.message(), Catch::Contains("symlink"));
    auto r = RevokeKeys(user, "spotvisor-gang:g:", true);
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK(S_ISLNK(Lstat(user.home + "/.ssh/authorized_keys").st_mode));
  }
  SECTION("~/.ssh is a symlink") {
    user.home = MakeHome(t, user, false);
    std::string other = t.path + "/other";
    REQUIRE(mkdir(other.c_str(), 0700) == 0);
    REQUIRE(symlink(other.c_str(), (user.home + "/.ssh").c_str()) == 0);
    auto s = AuthorizeKey(user, "10.0.0.1", key, "spotvisor-gang:g:1");
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(s.message(), Catch::Contains("symlink"));
    CHECK(RevokeKeys(user, "spotvisor-gang:g:1", false).status().code() == StatusCode::kFailedPrecondition);
    CHECK_FALSE(Exists(other + "/authorized_keys"));
    CHECK(Lstat(other).st_uid == 0);  // not chown'ed through the link
  }
  SECTION("authorized_keys is a hard link to another file") {
    user.home = MakeHome(t, user, true);
    REQUIRE(link(victim.c_str(), (user.home + "/.ssh/authorized_keys").c_str()) == 0);
    auto s = AuthorizeKey(user, "10.0.0.1", key, "spotvisor-gang:g:1");
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(s.message(), Catch::Contains("hard links"));
  }
  SECTION("authorized_keys belongs to somebody else") {
    user.home = MakeHome(t, user, true);
    std::string path = user.home + "/.ssh/authorized_keys";
    Write(path, "\n", 0600);
    REQUIRE(chown(path.c_str(), 12345, 12345) == 0);
    auto s = AuthorizeKey(user, "10.0.0.1", key, "spotvisor-gang:g:1");
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(s.message(), Catch::Contains("uid 12345"));
  }
  CHECK(Read(victim) == "root's file\n");
  CHECK(Lstat(victim).st_uid == 0);
  CHECK((Lstat(victim).st_mode & 07777) == 0600);
}

TEST_CASE("AuthorizeKey rejects bad addresses, keys and tags before touching anything") {
  if (!Root()) return;
  TempDir t;
  auto user = TestUser("");
  user.home = MakeHome(t, user, false);
  std::string key = std::string("ssh-ed25519 ") + kKeyA;
  for (std::string ip : {std::string(), std::string("10.0.0"), std::string("10.0.0.256"), std::string("10.0.0.1 "),
                         std::string("10.0.0.1,evil"), std::string("10.0.0.*"), std::string("fe80::1%eth0"),
                         std::string("leader.internal"), std::string("10.0.0.1\"x"), std::string("10.0.0.1/8"),
                         std::string("10.0.0.1").append(1, '\0').append("x"), std::string(100, '1')}) {
    INFO("ip: " << ip);
    auto s = AuthorizeKey(user, ip, key, "spotvisor-gang:g:1");
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(AllPrintable(s.message()));
  }
  for (std::string bad_key : {key + "\ncommand=\"/bin/sh\" " + key, "command=\"/bin/sh\" " + key,
                              "ssh-rsa " + std::string(kKeyA), std::string("ssh-ed25519 !!!!"), key + " a\"b"}) {
    INFO("key: " << bad_key);
    CHECK(AuthorizeKey(user, "10.0.0.1", bad_key, "spotvisor-gang:g:1").code() == StatusCode::kInvalidArgument);
  }
  for (std::string tag : {std::string(), std::string("a b"), std::string("x\ncommand=y"), std::string(201, 't')}) {
    INFO("tag: " << tag);
    CHECK(AuthorizeKey(user, "10.0.0.1", key, tag).code() == StatusCode::kInvalidArgument);
  }
  CHECK_FALSE(Exists(user.home + "/.ssh"));
}

TEST_CASE("RevokeKeys removes its tag's lines, or with prefix every generation of a gang, and nothing else") {
  if (!Root()) return;
  TempDir t;
  auto user = TestUser("");
  user.home = MakeHome(t, user, true);
  std::string path = user.home + "/.ssh/authorized_keys";
  std::string a = std::string("ssh-ed25519 ") + kKeyA;
  const std::string foreign = "# spotvisor-gang:g:1\nssh-ed25519 " + std::string(kKeyB) + " alice@laptop\n";
  const std::string g1 = "from=\"10.0.0.1\",restrict " + a + " spotvisor-gang:g:1\n";
  const std::string g1b = "from=\"10.0.0.2\",restrict " + a + " spotvisor-gang:g:1\r\n";
  const std::string g10 = "from=\"10.0.0.1\",restrict " + a + " spotvisor-gang:g:10\n";
  const std::string gx = "from=\"10.0.0.1\",restrict " + a + " spotvisor-gang:gx:1\n";
  const std::string g2 = "from=\"10.0.0.1\",restrict " + a + " spotvisor-gang:g:2";  // no newline
  Write(path, foreign + g1 + g10 + gx + g1b + g2, 0600);
  REQUIRE(chown(path.c_str(), kTestUid, user.gid) == 0);

  auto exact = RevokeKeys(user, "spotvisor-gang:g:1", false);
  REQUIRE(exact.ok());
  CHECK(*exact == 2);
  CHECK(Read(path) == foreign + g10 + gx + g2);
  CHECK(Lstat(path).st_uid == kTestUid);

  // Nothing matches: the file is not rewritten.
  auto inode = Lstat(path).st_ino;
  CHECK(*RevokeKeys(user, "spotvisor-gang:g:7", false) == 0);
  CHECK(Lstat(path).st_ino == inode);

  auto all = RevokeKeys(user, "spotvisor-gang:g:", true);
  REQUIRE(all.ok());
  CHECK(*all == 2);
  CHECK(Read(path) == foreign + gx);
  CHECK(*RevokeKeys(user, "spotvisor-gang:gx:", true) == 1);
  CHECK(Read(path) == foreign);
}

TEST_CASE("RevokeKeys with no ~/.ssh or no authorized_keys removes nothing and creates nothing") {
  if (!Root()) return;
  TempDir t;
  auto user = TestUser("");
  user.home = MakeHome(t, user, false);
  CHECK(*RevokeKeys(user, "spotvisor-gang:g:", true) == 0);
  CHECK_FALSE(Exists(user.home + "/.ssh"));
  REQUIRE(mkdir((user.home + "/.ssh").c_str(), 0700) == 0);
  CHECK(*RevokeKeys(user, "spotvisor-gang:g:1", false) == 0);
  CHECK_FALSE(Exists(user.home + "/.ssh/authorized_keys"));
  CHECK(RevokeKeys(user, "bad tag", false).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("OpenSSH's own parser reads the authorized_keys line as the generated key (ssh-keygen -l)") {
  auto ssh_keygen = FindSshKeygen();
  if (ssh_keygen.empty() || !Root()) return;
  TempDir t;
  auto user = TestUser("");
  ChildRegistry reg;
  auto pair = GenerateKeyPair(t.path + "/keys", "gang", "leader@g", user, reg, Background());
  REQUIRE(pair.ok());
  auto generated = Fingerprints(ssh_keygen, pair->private_key_path + ".pub");
  REQUIRE(generated.size() == 1);

  user.home = MakeHome(t, user, true);
  std::string path = user.home + "/.ssh/authorized_keys";
  Write(path, "ssh-ed25519 " + std::string(kKeyB) + " alice@laptop\n", 0600);
  REQUIRE(AuthorizeKey(user, "10.128.0.7", pair->public_key, "spotvisor-gang:g:4").ok());
  auto listed = Fingerprints(ssh_keygen, path);
  REQUIRE(listed.size() == 2);
  CHECK(listed[1].first == generated[0].first);
  CHECK(listed[1].second == "spotvisor-gang:g:4");
  CHECK(listed[0].first != generated[0].first);

  REQUIRE(*RevokeKeys(user, "spotvisor-gang:g:4", false) == 1);
  auto left = Fingerprints(ssh_keygen, path);
  REQUIRE(left.size() == 1);
  CHECK(left[0].first != generated[0].first);
}

}  // namespace
}  // namespace spotvisor
