#include "storage/user_credentials.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "storage/crc32c.h"
#include "storage/service_account.h"

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
  CHECK(make(R"({"type":"service_account","client_email":"a@b","private_key":"x"})").status().message().find(
            "private_key is not a PEM private key") != std::string::npos);
  CHECK(make(R"({"type":"service_account","private_key":"x"})").status().message().find("\"client_email\" is missing") !=
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

// A fresh RSA key in PKCS#8 PEM (what Google's key files hold), and its
// public half for checking signatures.
struct TestKey {
  explicit TestKey(int bits = 2048) {
    pkey = EVP_RSA_gen(static_cast<unsigned>(bits));
    BIO* b = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(b, pkey, nullptr, nullptr, 0, nullptr, nullptr);
    char* data = nullptr;
    long n = BIO_get_mem_data(b, &data);
    pem.assign(data, static_cast<std::size_t>(n));
    BIO_free(b);
  }
  ~TestKey() { EVP_PKEY_free(pkey); }
  bool Verifies(const std::string& data, const std::string& sig) const {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    bool ok = EVP_DigestVerifyInit(ctx, nullptr, EVP_sha256(), nullptr, pkey) == 1 &&
              EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                               reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1;
    EVP_MD_CTX_free(ctx);
    return ok;
  }
  EVP_PKEY* pkey = nullptr;
  std::string pem;
};

std::string Base64UrlDecode(std::string s) {
  for (char& c : s) c = c == '-' ? '+' : c == '_' ? '/' : c;
  while (s.size() % 4 != 0) s += '=';
  return Base64Decode(s).value();
}

TEST_CASE("base64url is base64 with - and _ and no padding") {
  CHECK(Base64UrlEncode("") == "");
  CHECK(Base64UrlEncode("f") == "Zg");
  CHECK(Base64UrlEncode("fo") == "Zm8");
  CHECK(Base64UrlEncode("foo") == "Zm9v");
  CHECK(Base64UrlEncode(std::string("\xfb\xff\xfe", 3)) == "-__-");
}

TEST_CASE("an RS256 JWT: three base64url parts, signed over the first two, checked with the public key") {
  TestKey k;
  auto key = RsaSigningKey::FromPem(k.pem, "key.json");
  REQUIRE(key.ok());
  auto jwt = MakeRs256Jwt(**key, R"({"alg":"RS256"})", R"({"iss":"x"})");
  REQUIRE(jwt.ok());
  auto dot1 = jwt->find('.'), dot2 = jwt->rfind('.');
  REQUIRE(dot1 != dot2);
  CHECK(Base64UrlDecode(jwt->substr(0, dot1)) == R"({"alg":"RS256"})");
  CHECK(Base64UrlDecode(jwt->substr(dot1 + 1, dot2 - dot1 - 1)) == R"({"iss":"x"})");
  auto sig = Base64UrlDecode(jwt->substr(dot2 + 1));
  CHECK(sig.size() == 256);
  CHECK(k.Verifies(jwt->substr(0, dot2), sig));
  CHECK_FALSE(k.Verifies(jwt->substr(0, dot2) + "x", sig));
}

TEST_CASE("private keys that cannot sign RS256 are refused, naming the file and never quoting the key") {
  auto err = [](const std::string& pem) { return RsaSigningKey::FromPem(pem, "sa.json").status().message(); };
  CHECK(err("").find("sa.json: private_key is empty") != std::string::npos);
  CHECK(err("-----BEGIN PRIVATE KEY-----\nAAAA-SECRET\n-----END PRIVATE KEY-----\n").find("not a PEM private key") !=
        std::string::npos);
  CHECK(err("-----BEGIN PRIVATE KEY-----\nAAAA-SECRET\n-----END PRIVATE KEY-----\n").find("SECRET") == std::string::npos);
  TestKey small(1024);
  CHECK(err(small.pem).find("1024-bit RSA key") != std::string::npos);
  EVP_PKEY* ec = EVP_EC_gen("P-256");
  BIO* b = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(b, ec, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  long n = BIO_get_mem_data(b, &data);
  std::string ec_pem(data, static_cast<std::size_t>(n));
  BIO_free(b);
  EVP_PKEY_free(ec);
  CHECK(err(ec_pem).find("not an RSA key") != std::string::npos);
}

TEST_CASE("ADC service_account: a signed assertion for the key's account, exchanged at token_uri, reused until near expiry") {
  TestKey k;
  TempDir d;
  nlohmann::json file = {{"type", "service_account"},
                         {"client_email", "sa@p.iam.gserviceaccount.com"},
                         {"private_key_id", "kid-1"},
                         {"private_key", k.pem},
                         {"token_uri", "http://127.0.0.1:1/token"}};
  auto path = d.Write("sa.json", file.dump());
  std::vector<HttpResponse> answers = {Answer(200, R"({"access_token":"sa-1","expires_in":3599})"),
                                       Answer(200, R"({"access_token":"sa-2","expires_in":3599})")};
  std::vector<HttpRequest> seen;
  FakeClock clock;
  auto p = MakeAdcTokenProvider(path, clock, [&] { return std::make_unique<ScriptedHttp>(&answers, &seen); });
  REQUIRE(p.ok());
  CHECK((*p)->AuthorizationHeader().value() == "Bearer sa-1");
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].url == "http://127.0.0.1:1/token");
  const std::string prefix = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=";
  REQUIRE(seen[0].body.rfind(prefix, 0) == 0);
  auto jwt = seen[0].body.substr(prefix.size());  // base64url and dots need no percent-encoding
  auto dot1 = jwt.find('.'), dot2 = jwt.rfind('.');
  auto header = nlohmann::json::parse(Base64UrlDecode(jwt.substr(0, dot1)));
  auto claims = nlohmann::json::parse(Base64UrlDecode(jwt.substr(dot1 + 1, dot2 - dot1 - 1)));
  CHECK(header == nlohmann::json({{"alg", "RS256"}, {"typ", "JWT"}, {"kid", "kid-1"}}));
  CHECK(claims["iss"] == "sa@p.iam.gserviceaccount.com");
  CHECK(claims["aud"] == "https://oauth2.googleapis.com/token");  // Google's, whatever token_uri is
  CHECK(claims["scope"] == "https://www.googleapis.com/auth/devstorage.read_write");
  CHECK(claims["iat"] == 0);  // the clock's wall time
  CHECK(claims["exp"] == 3600);
  CHECK(k.Verifies(jwt.substr(0, dot2), Base64UrlDecode(jwt.substr(dot2 + 1))));
  clock.now += 50min;
  CHECK((*p)->AuthorizationHeader().value() == "Bearer sa-1");
  clock.now += 6min;
  CHECK((*p)->AuthorizationHeader().value() == "Bearer sa-2");
  CHECK(seen.size() == 2);
}

TEST_CASE("ADC service_account: a refused key names the account and the likely causes, not the key") {
  TestKey k;
  TempDir d;
  nlohmann::json file = {{"type", "service_account"}, {"client_email", "sa@p"}, {"private_key", k.pem}};
  auto path = d.Write("sa.json", file.dump());
  std::vector<HttpResponse> answers = {
      Answer(400, R"({"error":"invalid_grant","error_description":"Invalid JWT Signature."})"),
      Answer(200, R"({"access_token":"two words","expires_in":3599})")};
  std::vector<HttpRequest> seen;
  FakeClock clock;
  auto p = MakeAdcTokenProvider(path, clock, [&] { return std::make_unique<ScriptedHttp>(&answers, &seen); });
  REQUIRE(p.ok());
  auto h = (*p)->AuthorizationHeader();
  REQUIRE_FALSE(h.ok());
  CHECK(h.status().code() == StatusCode::kPermissionDenied);
  CHECK(h.status().message().find("sa@p") != std::string::npos);
  CHECK(h.status().message().find("invalid_grant: Invalid JWT Signature.") != std::string::npos);
  CHECK(h.status().message().find("deleted or disabled") != std::string::npos);
  CHECK(h.status().message().find("PRIVATE KEY") == std::string::npos);
  CHECK(seen.at(0).url == "https://oauth2.googleapis.com/token");  // the default token_uri
  // An answer whose token could not be a header value is not used.
  CHECK((*p)->AuthorizationHeader().status().message().find("no usable access_token") != std::string::npos);
}

}  // namespace
}  // namespace spotvisor
