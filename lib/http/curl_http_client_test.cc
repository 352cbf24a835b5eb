#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <thread>

#include "http/http_client.h"

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

// A loopback server that accepts one connection, reads the request and never
// answers: a parked long-poll, or a hung server.
struct SilentServer {
  SilentServer() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(listen(fd, 4) == 0);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~SilentServer() {
    if (conn >= 0) close(conn);
    close(fd);
  }
  // Waits (bounded) for the client's request to arrive.
  bool AwaitRequest() {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10'000) != 1) return false;
    conn = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    pollfd q{conn, POLLIN, 0};
    return conn >= 0 && poll(&q, 1, 10'000) == 1;
  }
  int fd = -1, conn = -1;
  int port = 0;
};

TEST_CASE("curl client: Cancel() ends a request parked on a silent server at once, not at its timeout") {
  SilentServer server;
  auto http = MakeCurlHttpClient();
  HttpRequest req;
  req.url = "http://127.0.0.1:" + std::to_string(server.port) + "/computeMetadata/v1/instance/preempted";
  req.timeout = 600s;  // far beyond the wait below: only Cancel() can end it in time
  auto result = std::async(std::launch::async, [&] { return http->Perform(req); });
  REQUIRE(server.AwaitRequest());
  // The request is parked in curl_multi_poll now (or about to be): cancel it.
  http->Cancel();
  REQUIRE(result.wait_for(30s) == std::future_status::ready);
  auto r = result.get();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kCancelled);
  // And every later request on this client fails at once.
  CHECK(http->Perform(req).status().code() == StatusCode::kCancelled);
}

TEST_CASE("curl client: a request's own timeout still ends it without any periodic wakeup") {
  SilentServer server;
  auto http = MakeCurlHttpClient();
  HttpRequest req;
  req.url = "http://127.0.0.1:" + std::to_string(server.port) + "/";
  req.timeout = 300ms;
  auto result = std::async(std::launch::async, [&] { return http->Perform(req); });
  REQUIRE(server.AwaitRequest());
  REQUIRE(result.wait_for(30s) == std::future_status::ready);
  CHECK(result.get().status().code() == StatusCode::kDeadlineExceeded);
}

TEST_CASE("curl client: a header sent twice is kept as one list, as Cloud Storage's two x-goog-hash lines need") {
  SilentServer server;
  auto http = MakeCurlHttpClient();
  HttpRequest req;
  req.url = "http://127.0.0.1:" + std::to_string(server.port) + "/download/storage/v1/b/b/o/x?alt=media";
  req.timeout = 30s;
  auto result = std::async(std::launch::async, [&] { return http->Perform(req); });
  REQUIRE(server.AwaitRequest());
  std::string answer =
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-goog-hash: crc32c=yZRlqg==\r\nX-Goog-Hash: md5=XrY7u+Ae7tCTyyK7j1rNww==\r\n"
      "Connection: close\r\n\r\nhi";
  REQUIRE(write(server.conn, answer.data(), answer.size()) == static_cast<ssize_t>(answer.size()));
  REQUIRE(result.wait_for(30s) == std::future_status::ready);
  auto r = result.get();
  REQUIRE(r.ok());
  CHECK(r->body == "hi");
  CHECK(r->Header("x-goog-hash") == "crc32c=yZRlqg==, md5=XrY7u+Ae7tCTyyK7j1rNww==");
}

}  // namespace
}  // namespace spotvisor
