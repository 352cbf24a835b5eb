// A real etcd (Debian's etcd-server) for integration tests: started on free
// loopback ports in a temp dir, health-checked, killed and restarted on
// demand. Shared by the etcd client's and the gang coordinator's tests.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "http/http_client.h"

extern char** environ;

namespace spotvisor::etcd_test {

using namespace std::chrono_literals;
using json = nlohmann::json;

inline std::string FindOnPath(const std::string& name) {
  if (const char* bin = std::getenv("ETCD_BIN"); bin && name == "etcd") return bin;
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(ss, dir, ':');) {
    auto p = std::filesystem::path(dir) / name;
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

struct Tls {
  std::string ca, server_cert, server_key, client_cert, client_key;
};

// Waits for `cond` up to `bound`, checking every 20 ms. Integration tests
// wait on conditions, never for a fixed time.
template <typename Fn>
inline bool WaitFor(std::chrono::milliseconds bound, Fn&& cond) {
  auto end = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return cond();
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/spotvisor-etcd-it.XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One etcd member in `dir`; Start/Kill/Start again keeps its data and ports.
class Etcd {
 public:
  explicit Etcd(const std::string& dir, std::optional<Tls> tls = std::nullopt)
      : dir_(dir), tls_(std::move(tls)), client_port_(FreePort()), peer_port_(FreePort()) {
    Start();
  }
  ~Etcd() { Kill(); }

  std::string Url() const {
    return fmt::format("{}://127.0.0.1:{}", tls_ ? "https" : "http", client_port_);
  }

  void Start() {
    std::string peer = fmt::format("http://127.0.0.1:{}", peer_port_);
    std::vector<std::string> args = {"etcd",
                                     "--name=it",
                                     "--data-dir=" + dir_ + "/data",
                                     "--listen-client-urls=" + Url(),
                                     "--advertise-client-urls=" + Url(),
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=it=" + peer,
                                     "--logger=zap",
                                     "--log-outputs=stderr"};
    if (tls_) {
      args.push_back("--cert-file=" + tls_->server_cert);
      args.push_back("--key-file=" + tls_->server_key);
      args.push_back("--trusted-ca-file=" + tls_->ca);
      args.push_back("--client-cert-auth");
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    std::string log = dir_ + "/etcd.log";
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    static const std::string bin = FindOnPath("etcd");
    int rc = posix_spawn(&pid_, bin.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE(rc == 0);
    auto http = MakeCurlHttpClient();
    bool healthy = WaitFor(20s, [&] {
      HttpRequest req;
      req.url = Url() + "/health";
      req.timeout = 1s;
      if (tls_) {
        req.ca_file = tls_->ca;
        req.cert_file = tls_->client_cert;
        req.key_file = tls_->client_key;
      }
      auto r = http->Perform(req);
      return r.ok() && r->status == 200 && r->body.find("true") != std::string::npos;
    });
    if (!healthy) {
      Kill();  // FAIL throws out of the constructor: no destructor will
      FAIL("etcd did not become healthy within 20 s; its log:\n" << Log());
    }
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }

  std::string Log() const {
    std::ifstream f(dir_ + "/etcd.log");
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
  }

  // A call the client does not offer, straight to the gateway.
  json Raw(const std::string& path, const json& body, const std::string& token = "") const {
    auto http = MakeCurlHttpClient();
    HttpRequest req;
    req.method = "POST";
    req.url = Url() + path;
    req.body = body.dump();
    req.timeout = 10s;
    if (!token.empty()) req.headers.emplace_back("Authorization", token);
    auto r = http->Perform(req);
    REQUIRE(r.ok());
    INFO(path << " -> " << r->body);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  }

 private:
  std::string dir_;
  std::optional<Tls> tls_;
  int client_port_, peer_port_;
  pid_t pid_ = -1;
};

}  // namespace spotvisor::etcd_test
