#include "metadata/metadata_client.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace spotvisor {
namespace {

// Answers every request with one canned response and records the URLs.
class CannedHttp final : public HttpClient {
 public:
  CannedHttp(long status, std::string body, std::vector<std::string>* urls) : status_(status), body_(std::move(body)), urls_(urls) {}
  StatusOr<HttpResponse> Perform(const HttpRequest& request) override {
    urls_->push_back(request.url);
    HttpResponse r;
    r.status = status_;
    r.body = body_;
    r.headers = {{"metadata-flavor", "Google"}, {"etag", "e1"}};
    return r;
  }
  void Cancel() override {}

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

}  // namespace
}  // namespace spotvisor
