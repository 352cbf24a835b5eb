#include "storage/token_provider.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

class FakeClock final : public Clock {
 public:
  SteadyTime Now() const override { return now; }
  WallTime WallNow() const override { return {}; }
  SteadyTime now{std::chrono::hours(1)};
};

// Records token requests; each answer is a new token lasting `expires_in`.
class TokenMetadata final : public MetadataClient {
 public:
  using MetadataClient::Get;
  StatusOr<MetadataValue> Get(const std::string& path, const CallContext& ctx) override {
    paths.push_back(path);
    if (block) {  // a metadata server that never answers: only the context ends the wait
      while (!ctx.cancelled()) ctx.cancel->WaitFor(std::chrono::milliseconds(50));
      return CancelledError("metadata " + path + ": cancelled");
    }
    if (fail) return UnavailableError("503");
    if (!raw.empty()) return MetadataValue{raw, ""};
    return MetadataValue{R"({"access_token":"t)" + std::to_string(paths.size()) + R"(","expires_in":)" +
                             std::to_string(expires_in) + R"(,"token_type":"Bearer"})",
                         ""};
  }
  StatusOr<MetadataValue> Watch(const std::string&, const std::string&, std::chrono::seconds) override {
    return UnavailableError("not used");
  }
  StatusOr<std::map<std::string, std::string>> GetAttributes(const std::string&) override { return UnavailableError("not used"); }
  Status PutGuestAttribute(const std::string&, const std::string&) override { return UnavailableError("not used"); }
  void Cancel() override {}

  std::vector<std::string> paths;
  int expires_in = 3599;
  bool fail = false;
  bool block = false;
  std::string raw;  // when set, the answer as is
};

TEST_CASE("the token is cached, and refreshed five minutes before it expires") {
  FakeClock clock;
  auto md = std::make_unique<TokenMetadata>();
  auto* m = md.get();
  MetadataTokenProvider tokens(std::move(md), clock);
  CHECK(*tokens.AuthorizationHeader() == "Bearer t1");
  clock.now += 54min;
  CHECK(*tokens.AuthorizationHeader() == "Bearer t1");  // still cached
  CHECK(m->paths == std::vector<std::string>{"instance/service-accounts/default/token"});
  clock.now += 1min;  // 55 min: inside the last five minutes of 59m59s
  CHECK(*tokens.AuthorizationHeader() == "Bearer t2");
  CHECK(m->paths.size() == 2);
}

TEST_CASE("a failure to get a token is an error, not an empty token") {
  FakeClock clock;
  auto md = std::make_unique<TokenMetadata>();
  md->fail = true;
  MetadataTokenProvider tokens(std::move(md), clock);
  CHECK(tokens.AuthorizationHeader().status().code() == StatusCode::kUnavailable);
}

TEST_CASE("a token answer with a wrongly typed or huge expires_in is not a crash") {
  FakeClock clock;
  for (auto raw : {R"({"access_token":"a","expires_in":"3599"})", R"({"access_token":"a","expires_in":1e400})",
                   R"({"access_token":"a","expires_in":-5})", R"({"access_token":"a","expires_in":18446744073709551615})"}) {
    INFO(raw);
    auto m = std::make_unique<TokenMetadata>();
    m->raw = raw;
    MetadataTokenProvider p(std::move(m), clock);
    auto h = p.AuthorizationHeader();
    if (h.ok()) CHECK(*h == "Bearer a");  // 1e400 is not JSON at all: an error, also fine
  }
}

TEST_CASE("a token fetch is bounded by the caller's context: a stop cuts a hung metadata server short") {
  FakeClock clock;
  auto md = std::make_unique<TokenMetadata>();
  md->block = true;
  auto* m = md.get();
  MetadataTokenProvider tokens(std::move(md), clock);
  CallContext ctx;
  ctx.cancel = std::make_shared<CancelSource>();
  ctx.cancel->Cancel();  // the stop came first; without the context this would wait forever
  auto r = tokens.AuthorizationHeader(ctx);
  CHECK(r.status().code() == StatusCode::kCancelled);
  CHECK(m->paths.size() == 1);
}

}  // namespace
}  // namespace spotvisor
