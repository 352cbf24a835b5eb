#include "metadata/metadata_client.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace spotvisor {
namespace {

// Answers every request with one canned response and records the URLs.
class CannedHttp final : public HttpClient {
 public:
  CannedHttp(long status, std::string body, std::vector<std::string>* urls) : status_(status), body_(std::move(body)), urls_(urls) {}
  StatusOr<HttpResponse> Perform(const HttpRequest& request) override {
    urls_->push_back(request.url);
    last_timeout = request.timeout;
    HttpResponse r;
    r.status = status_;
    r.body = body_;
    r.headers = {{"metadata-flavor", "Google"}, {"etag", "e1"}};
    return r;
  }
  void Cancel() override {}
  std::chrono::milliseconds last_timeout{0};

 private:
  long status_;
  std::string body_;
  std::vector<std::string>* urls_;
};

std::unique_ptr<MetadataClient> Client(long status, std::string body, std::vector<std::string>* urls) {
  return MakeMetadataClient(MetadataEndpoint{"md", std::chrono::milliseconds(100)},
                            std::make_unique<CannedHttp>(status, std::move(body), urls));
}

TEST_CASE("attributes: an empty directory answered with 404 or nothing is no attributes", "[metadata][issue12]") {
  std::vector<std::string> urls;
  auto a = Client(404, "not found", &urls)->GetAttributes("instance/attributes/");
  REQUIRE(a.ok());
  CHECK(a->empty());
  auto b = Client(200, "", &urls)->GetAttributes("instance/attributes/");
  REQUIRE(b.ok());
  CHECK(b->empty());
  // Other failures are still failures.
  CHECK(Client(503, "", &urls)->GetAttributes("instance/attributes/").status().code() == StatusCode::kUnavailable);
}

TEST_CASE("attributes: malformed JSON is a permanent error that names the directory", "[metadata][issue12]") {
  std::vector<std::string> urls;
  for (std::string body : {"{\"spotvisor-command\": \"x\"", "[1, 2]", "\"text\"", "<html>\xff</html>", "{\"a\":\"\xff\"}"}) {
    INFO(body);
    auto a = Client(200, body, &urls)->GetAttributes("instance/attributes/");
    REQUIRE_FALSE(a.ok());
    CHECK(a.status().code() == StatusCode::kFailedPrecondition);
    CHECK(a.status().message().find("metadata instance/attributes/: expected a JSON object of attributes") == 0);
  }
  auto deep = ParseAttributes("{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", "m");
  CHECK(deep.status().code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("attributes: values of any JSON type, never an exception", "[metadata][issue12]") {
  auto a = ParseAttributes(R"({"s":"caf\u00e9","n":5,"o":{"k":[true,null]},"e":"\ud83d\ude00"})", "m");
  REQUIRE(a.ok());
  CHECK(a->at("s") == "caf\xc3\xa9");
  CHECK(a->at("n") == "5");
  CHECK(a->at("o") == R"({"k":[true,null]})");
  CHECK(a->at("e") == "\xf0\x9f\x98\x80");
}

TEST_CASE("the ETag sent back in a long-poll is percent-encoded", "[metadata][issue12]") {
  std::vector<std::string> urls;
  auto c = Client(200, "FALSE", &urls);
  REQUIRE(c->Watch("instance/preempted", "ab&c d\xff", std::chrono::seconds(5)).ok());
  REQUIRE(urls.size() == 1);
  CHECK(urls[0] == "http://md/computeMetadata/v1/instance/preempted?wait_for_change=true&timeout_sec=5&last_etag=ab%26c%20d%FF");
}

TEST_CASE("JSON nesting depth skips brackets inside strings", "[metadata]") {
  CHECK(JsonNestingDepth(R"({"a":"[[[[\"{{","b":[1,[2]]})", 100) == 3);
  CHECK(JsonNestingDepth(std::string(50, '['), 10) == 11);
}

class FakeClockMd final : public Clock {
 public:
  SteadyTime Now() const override { return now; }
  WallTime WallNow() const override { return {}; }
  SteadyTime now{std::chrono::hours(1)};
};

// Hangs until cancelled, like a metadata server that accepted the
// connection and never answers.
class HangingHttp final : public HttpClient {
 public:
  StatusOr<HttpResponse> Perform(const HttpRequest& request) override {
    std::unique_lock lk(mu);
    started = true;
    cv.notify_all();
    cv.wait(lk, [this] { return cancelled; });
    return CancelledError(request.url + ": cancelled");
  }
  void Cancel() override {
    std::lock_guard lk(mu);
    cancelled = true;
    cv.notify_all();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool started = false, cancelled = false;
};

TEST_CASE("a metadata read carries the caller's deadline and cancellation", "[metadata][issue12]") {
  std::vector<std::string> urls;
  auto canned = std::make_unique<CannedHttp>(200, "v", &urls);
  auto* http = canned.get();
  auto client = MakeMetadataClient(MetadataEndpoint{"md", std::chrono::milliseconds(5000)}, std::move(canned));
  FakeClockMd clock;
  CallContext ctx;
  ctx.clock = &clock;
  ctx.deadline = clock.now + std::chrono::milliseconds(1500);
  REQUIRE(client->Get("instance/id", ctx).ok());
  CHECK(http->last_timeout == std::chrono::milliseconds(1500));  // clamped from 10 s
  clock.now += std::chrono::seconds(2);
  CHECK(client->Get("instance/id", ctx).status().code() == StatusCode::kDeadlineExceeded);
  CHECK(urls.size() == 1);  // out of time: no request at all

  // A cancellable call gets its own HTTP client, which the cancellation aborts.
  std::atomic<HangingHttp*> raw{nullptr};
  auto cancellable = MakeMetadataClient(MetadataEndpoint{"md", std::chrono::milliseconds(5000)},
                                        std::make_unique<CannedHttp>(200, "v", &urls), [&] {
                                          auto h = std::make_unique<HangingHttp>();
                                          raw = h.get();
                                          return std::unique_ptr<HttpClient>(std::move(h));
                                        });
  CallContext stop;
  stop.cancel = std::make_shared<CancelSource>();
  std::thread canceller([&] {
    // Waits (on a condition, not a clock) until the request hangs, then stops it.
    while (true) {
      if (HangingHttp* h = raw.load()) {
        std::unique_lock lk(h->mu);
        if (h->cv.wait_for(lk, std::chrono::milliseconds(10), [h] { return h->started; })) break;
      } else {
        std::this_thread::yield();
      }
    }
    stop.cancel->Cancel();
  });
  auto r = cancellable->Get("instance/service-accounts/default/token", stop);
  canceller.join();
  CHECK(r.status().code() == StatusCode::kCancelled);
  // The client's own HTTP client was not cancelled: later reads still work.
  CHECK(cancellable->Get("instance/id").ok());
}

}  // namespace
}  // namespace spotvisor

namespace spotvisor {
namespace {

TEST_CASE("a path with its own query gets the long-poll's parameters after &, a 503's body is quoted in the error") {
  std::vector<std::string> urls;
  auto c = Client(200, "NONE", &urls);
  REQUIRE(c->Watch("instance/upcoming-maintenance?alt=json", "0", std::chrono::seconds(5)).ok());
  CHECK(urls.at(0) == "http://md/computeMetadata/v1/instance/upcoming-maintenance?alt=json&wait_for_change=true&timeout_sec=5&last_etag=0");
  auto busy = Client(503, "{\"error\": \"no notifications have been received yet, try again later\"}", &urls);
  auto r = busy->Get("instance/upcoming-maintenance");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnavailable);
  CHECK(r.status().message().find("HTTP 503: {\"error\": \"no notifications") != std::string::npos);
  auto bare = Client(503, std::string(300, 'x') + "\xff", &urls);
  auto b = bare->Get("instance/preempted");
  CHECK(b.status().message() == "metadata instance/preempted: HTTP 503: " + std::string(200, 'x'));
}

}  // namespace
}  // namespace spotvisor
