#include "storage/user_credentials.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

class FakeClock final : public Clock {
 public:
  SteadyTime Now() const override { return now; }
  WallTime WallNow() const override { return WallTime{}; }
  SteadyTime now{std::chrono::hours(1)};
};

// The token endpoint's answers, in order; records each request.
class ScriptedHttp final : public HttpClient {
 public:
  explicit ScriptedHttp(std::vector<HttpResponse>* answers, std::vector<HttpRequest>* seen) : answers_(answers), seen_(seen) {}
  StatusOr<HttpResponse> Perform(const HttpRequest& r) override {
    seen_->push_back(r);
    if (answers_->empty()) return UnavailableError("no more answers");
    auto a = answers_->front();
    answers_->erase(answers_->begin());
    return a;
  }
  void Cancel() override {}

 private:
  std::vector<HttpResponse>* answers_;
  std::vector<HttpRequest>* seen_;
};

struct TempDir {
  TempDir() {
    char t[] = "/tmp/spotvisor-adc-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string Write(const std::string& name, const std::string& text) const {
    auto p = path + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  std::string path;
};

HttpResponse Answer(long status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

TEST_CASE("ADC authorized_user: the refresh token is exchanged once, form-encoded, and the token reused until near expiry") {
  TempDir d;
  auto path = d.Write("adc.json", R"({"type":"authorized_user","client_id":"id 1","client_secret":"s&2",
                                      "refresh_token":"1//r=3","token_uri":"http://127.0.0.1:1/token"})");
  std::vector<HttpResponse> answers = {Answer(200, R"({"access_token":"tok-1","expires_in":3600})"),
                                       Answer(200, R"({"access_token":"tok-2","expires_in":3600})")};
  std::vector<HttpRequest> seen;
  FakeClock clock;
  auto p = MakeAdcTokenProvider(path, clock, [&] { return std::make_unique<ScriptedHttp>(&answers, &seen); });
  REQUIRE(p.ok());
  CHECK((*p)->AuthorizationHeader().value() == "Bearer tok-1");
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].method == "POST");
  CHECK(seen[0].url == "http://127.0.0.1:1/token");
  CHECK(seen[0].body == "grant_type=refresh_token&client_id=id%201&client_secret=s%262&refresh_token=1%2F%2Fr%3D3");
  clock.now += 50min;
  CHECK((*p)->AuthorizationHeader().value() == "Bearer tok-1");
  CHECK(seen.size() == 1);
  clock.now += 6min;  // within five minutes of expiry: refreshed
  CHECK((*p)->AuthorizationHeader().value() == "Bearer tok-2");
  CHECK(seen.size() == 2);
}

TEST_CASE("ADC: a revoked login says how to log in again, without the token in the message") {
  TempDir d;
  auto path = d.Write("adc.json", R"({"type":"authorized_user","client_id":"i","client_secret":"s","refresh_token":"SECRET-R"})");
  std::vector<HttpResponse> answers = {Answer(400, R"({"error":"invalid_grant","error_description":"Token has been expired or revoked."})")};
  std::vector<HttpRequest> seen;
  FakeClock clock;
  auto p = MakeAdcTokenProvider(path, clock, [&] { return std::make_unique<ScriptedHttp>(&answers, &seen); });
  REQUIRE(p.ok());
  auto h = (*p)->AuthorizationHeader();
  REQUIRE_FALSE(h.ok());
  CHECK(h.status().code() == StatusCode::kPermissionDenied);
  CHECK(h.status().message().find("gcloud auth application-default login") != std::string::npos);
  CHECK(h.status().message().find("SECRET-R") == std::string::npos);
  CHECK(seen.at(0).url == "https://oauth2.googleapis.com/token");  // the default token_uri
}

TEST_CASE("ADC files that are not usable are errors naming the file and the problem") {
  TempDir d;
  FakeClock clock;
  auto make = [&](const std::string& text) { return MakeAdcTokenProvider(d.Write("f.json", text), clock); };
  CHECK(make("not json").status().message().find("not a JSON object") != std::string::npos);
  CHECK(make(R"({"type":"service_account","private_key":"x"})").status().message().find("--access-token-command") !=
        std::string::npos);
  CHECK(make(R"({"type":"external_account"})").status().message().find("\"external_account\" are not supported") !=
        std::string::npos);
  CHECK(make(R"({"type":"authorized_user","client_id":"i","client_secret":"s"})").status().message().find(
            "\"refresh_token\" is missing") != std::string::npos);
  CHECK(make(R"({"type":"authorized_user","client_id":"i","client_secret":"s","refresh_token":"r","token_uri":"file:///x"})")
            .status()
            .message()
            .find("token_uri") != std::string::npos);
  CHECK_FALSE(MakeAdcTokenProvider(d.path + "/missing.json", clock).ok());
}

TEST_CASE("where ADC is found: the variable, else gcloud's file under CLOUDSDK_CONFIG or HOME") {
  TempDir d;
  auto saved = [](const char* k) { const char* v = std::getenv(k); return v ? std::optional<std::string>(v) : std::nullopt; };
  auto gac = saved("GOOGLE_APPLICATION_CREDENTIALS"), cfg = saved("CLOUDSDK_CONFIG"), home = saved("HOME");
  setenv("GOOGLE_APPLICATION_CREDENTIALS", "/x/adc.json", 1);
  CHECK(FindAdcFile() == "/x/adc.json");
  unsetenv("GOOGLE_APPLICATION_CREDENTIALS");
  setenv("CLOUDSDK_CONFIG", d.path.c_str(), 1);
  CHECK(FindAdcFile().empty());  // no file there
  auto f = d.Write("application_default_credentials.json", "{}");
  CHECK(FindAdcFile() == f);
  unsetenv("CLOUDSDK_CONFIG");
  std::filesystem::create_directories(d.path + "/.config/gcloud");
  setenv("HOME", d.path.c_str(), 1);
  CHECK(FindAdcFile().empty());
  d.Write(".config/gcloud/application_default_credentials.json", "{}");
  CHECK(FindAdcFile() == d.path + "/.config/gcloud/application_default_credentials.json");
  for (auto [k, v] : {std::pair{"GOOGLE_APPLICATION_CREDENTIALS", gac}, std::pair{"CLOUDSDK_CONFIG", cfg}, std::pair{"HOME", home}}) {
    if (v) setenv(k, v->c_str(), 1); else unsetenv(k);
  }
}

TEST_CASE("a token command (--access-token-command): its trimmed output is the token, a failure or junk is an error") {
  FakeClock clock;
  CHECK(MakeCommandTokenProvider("printf ' tok-9\\n'", clock)->AuthorizationHeader().value() == "Bearer tok-9");
  auto failed = MakeCommandTokenProvider("exit 3", clock)->AuthorizationHeader();
  CHECK(failed.status().message().find("failed (exit code 3)") != std::string::npos);
  auto junk = MakeCommandTokenProvider("echo 'ERROR: (gcloud) You do not currently have an active account'", clock)
                  ->AuthorizationHeader();
  CHECK(junk.status().message() == "--access-token-command printed something that is not an access token");
  auto slow = MakeCommandTokenProvider("sleep 5", clock, 200ms)->AuthorizationHeader();
  CHECK(slow.status().code() == StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace spotvisor
