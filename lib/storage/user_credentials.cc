#include "storage/user_credentials.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "log/logger.h"
#include "output/utf8.h"
#include "storage/service_account.h"

namespace spotvisor {
namespace {

using Json = nlohmann::json;
constexpr char kGoogleTokenUri[] = "https://oauth2.googleapis.com/token";

// Runs /bin/sh -c `command`, collecting stdout (at most 64 KiB) within `timeout`.
StatusOr<std::string> RunForOutput(const std::string& command, std::chrono::milliseconds timeout) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(fds[0]);
    close(fds[1]);
    return ErrnoToStatus(err, "fork");
  }
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    // A new process group, so a timeout can stop the whole pipeline.
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[4096];
    ssize_t r = read(fds[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (out.size() < (64u << 10)) out.append(buf, static_cast<std::size_t>(r));
  }
  close(fds[0]);
  if (timed_out) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return DeadlineExceededError(fmt::format("--access-token-command did not finish within {} s",
                                             std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return PermissionDeniedError(fmt::format("--access-token-command \"{}\" failed ({})", output::EscapeInvalidUtf8(command),
                                             WIFEXITED(status) ? fmt::format("exit code {}", WEXITSTATUS(status))
                                                               : fmt::format("signal {}", WTERMSIG(status))));
  }
  return out;
}

// An access token as the server sent it goes into a header: one line of
// token characters, or it is refused (never echoed: it may be a secret).
bool LooksLikeAccessToken(std::string_view token) {
  return !token.empty() && token.size() <= 8192 && token.find_first_of(" \t\r\n\"'") == std::string_view::npos &&
         output::IsValidUtf8(token);
}

class CommandTokens final : public TokenProvider {
 public:
  CommandTokens(std::string command, const Clock& clock, std::chrono::milliseconds timeout)
      : command_(std::move(command)), clock_(clock), timeout_(timeout) {}
  using TokenProvider::AuthorizationHeader;
  StatusOr<std::string> AuthorizationHeader(const CallContext& ctx) override {
    std::lock_guard lk(mu_);
    if (!header_.empty() && clock_.Now() < refresh_at_) return header_;
    if (auto c = ctx.Check("getting an access token"); !c.ok()) return c;
    auto out = RunForOutput(command_, ctx.Remaining(timeout_));
    if (!out.ok()) return out.status();
    auto token = std::string(Trim(*out));
    // One line of token characters; anything else (an error message, a
    // prompt) must not be sent as a header.
    if (!LooksLikeAccessToken(token)) {
      return PermissionDeniedError("--access-token-command printed something that is not an access token");
    }
    header_ = "Bearer " + token;
    refresh_at_ = clock_.Now() + std::chrono::minutes(10);
    return header_;
  }

 private:
  std::string command_;
  const Clock& clock_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::string header_;
  SteadyTime refresh_at_{};
};

struct TokenGrant {
  std::string header;                 // "Bearer TOKEN"
  std::chrono::seconds expires_in{};  // as the server said, clamped to [0, 24 h]
};

// One POST of a form to an OAuth 2.0 token endpoint (RFC 6749 section 5).
// `refused` turns a non-200 answer's `error` code into the message.
StatusOr<TokenGrant> ExchangeAtTokenEndpoint(HttpClient& http, const std::string& token_uri, std::string form,
                                             const CallContext& ctx,
                                             const std::function<Status(int http_status, const std::string& error,
                                                                        const std::string& description)>& refused) {
  HttpRequest req;
  req.method = "POST";
  req.url = token_uri;
  req.headers = {{"Content-Type", "application/x-www-form-urlencoded"}};
  req.body = std::move(form);
  req.timeout = ctx.Remaining(std::chrono::seconds(30));
  if (auto c = ctx.Check("getting an access token"); !c.ok()) return c;
  auto r = http.Perform(req);
  if (!r.ok()) return Status(r.status().code(), "getting an access token from " + token_uri + ": " + r.status().message());
  auto j = Json::parse(r->body, nullptr, false);
  auto str = [&](const char* k) -> std::string {
    if (!j.is_object()) return "";
    auto it = j.find(k);
    return it != j.end() && it->is_string() ? output::EscapeInvalidUtf8(it->get<std::string>().substr(0, 300)) : "";
  };
  if (r->status != 200) return refused(r->status, str("error"), str("error_description"));
  if (!j.is_object() || !j.contains("access_token") || !j["access_token"].is_string() ||
      !LooksLikeAccessToken(j["access_token"].get<std::string>())) {
    return UnavailableError(token_uri + ": the answer has no usable access_token");
  }
  std::int64_t expires_in = 300;
  if (auto e = j.find("expires_in"); e != j.end() && e->is_number_integer()) {
    expires_in = std::clamp<std::int64_t>(e->get<std::int64_t>(), 0, 24 * 3600);
  }
  return TokenGrant{"Bearer " + j["access_token"].get<std::string>(), std::chrono::seconds(expires_in)};
}

// When to ask again: 5 minutes before expiry, or half way for short tokens.
SteadyTime RefreshAt(SteadyTime now, std::chrono::seconds expires) {
  return now + std::max(expires - std::chrono::seconds(300), expires / 2);
}

// Keeps the header a grant gave until it is near its expiry; the subclass
// says how to get a grant.
class CachedGrantTokens : public TokenProvider {
 public:
  explicit CachedGrantTokens(const Clock& clock) : clock_(clock) {}
  using TokenProvider::AuthorizationHeader;
  StatusOr<std::string> AuthorizationHeader(const CallContext& ctx) final {
    std::lock_guard lk(mu_);
    auto now = clock_.Now();
    if (!header_.empty() && now < refresh_at_) return header_;
    auto grant = Grant(ctx);
    if (!grant.ok()) return grant.status();
    header_ = grant->header;
    refresh_at_ = RefreshAt(now, grant->expires_in);
    return header_;
  }

 protected:
  virtual StatusOr<TokenGrant> Grant(const CallContext& ctx) = 0;
  const Clock& clock_;

 private:
  std::mutex mu_;
  std::string header_;
  SteadyTime refresh_at_{};
};

// gcloud auth application-default login: a refresh token exchanged for
// access tokens at token_uri (RFC 6749 section 6).
class AuthorizedUserTokens final : public CachedGrantTokens {
 public:
  AuthorizedUserTokens(std::string path, std::string client_id, std::string client_secret, std::string refresh_token,
                       std::string token_uri, const Clock& clock, std::unique_ptr<HttpClient> http)
      : CachedGrantTokens(clock),
        path_(std::move(path)),
        client_id_(std::move(client_id)),
        client_secret_(std::move(client_secret)),
        refresh_token_(std::move(refresh_token)),
        token_uri_(std::move(token_uri)),
        http_(std::move(http)) {}

 private:
  StatusOr<TokenGrant> Grant(const CallContext& ctx) override {
    return ExchangeAtTokenEndpoint(
        *http_, token_uri_,
        "grant_type=refresh_token&client_id=" + UrlEncode(client_id_) + "&client_secret=" + UrlEncode(client_secret_) +
            "&refresh_token=" + UrlEncode(refresh_token_),
        ctx, [&](int status, const std::string& error, const std::string&) {
          std::string hint = error == "invalid_grant" || error == "invalid_client"
                                 ? "; the login has expired or was revoked: run `gcloud auth application-default login` again"
                                 : "";
          return PermissionDeniedError(fmt::format("{} refused the refresh token from {} (HTTP {}{}){}", token_uri_,
                                                   path_, status, error.empty() ? "" : ": " + error, hint));
        });
  }

  std::string path_, client_id_, client_secret_, refresh_token_, token_uri_;
  std::unique_ptr<HttpClient> http_;
};

// A service-account key: a JWT assertion, signed with the key and good for
// an hour, exchanged at token_uri (RFC 7523; grant type jwt-bearer). The
// audience is Google's token endpoint whatever token_uri says, as Google
// documents it ("this value is always https://oauth2.googleapis.com/token").
class ServiceAccountTokens final : public CachedGrantTokens {
 public:
  ServiceAccountTokens(std::string path, std::string email, std::string key_id, std::unique_ptr<RsaSigningKey> key,
                       std::string token_uri, const Clock& clock, std::unique_ptr<HttpClient> http)
      : CachedGrantTokens(clock),
        path_(std::move(path)),
        email_(std::move(email)),
        key_id_(std::move(key_id)),
        key_(std::move(key)),
        token_uri_(std::move(token_uri)),
        http_(std::move(http)) {}
  void SetScope(std::string scope) { scope_ = std::move(scope); }

 private:
  StatusOr<TokenGrant> Grant(const CallContext& ctx) override {
    auto iat = std::chrono::duration_cast<std::chrono::seconds>(clock_.WallNow().time_since_epoch()).count();
    Json header = {{"alg", "RS256"}, {"typ", "JWT"}};
    if (!key_id_.empty()) header["kid"] = key_id_;
    Json claims = {{"iss", email_},
                   {"scope", scope_},
                   {"aud", kGoogleTokenUri},
                   {"iat", iat},
                   {"exp", iat + 3600}};
    // Strings from the key file may be anything: dump() must not throw on them.
    auto jwt = MakeRs256Jwt(*key_, header.dump(-1, ' ', false, Json::error_handler_t::replace),
                            claims.dump(-1, ' ', false, Json::error_handler_t::replace));
    if (!jwt.ok()) return jwt.status();
    return ExchangeAtTokenEndpoint(
        *http_, token_uri_, "grant_type=" + UrlEncode(kJwtBearerGrant) + "&assertion=" + UrlEncode(*jwt), ctx,
        [&](int status, const std::string& error, const std::string& description) {
          std::string hint;
          if (error == "invalid_grant") {
            hint = "; the key may have been deleted or disabled, or this machine's clock is off (it says " +
                   FormatRfc3339(clock_.WallNow()) + ")";
          }
          return PermissionDeniedError(fmt::format("{} refused the service-account key {} for {} (HTTP {}{}{}){}",
                                                   token_uri_, path_, output::EscapeInvalidUtf8(email_), status,
                                                   error.empty() ? "" : ": " + error,
                                                   description.empty() ? "" : ": " + description, hint));
        });
  }

  static constexpr char kJwtBearerGrant[] = "urn:ietf:params:oauth:grant-type:jwt-bearer";
  // The laptop commands list, read and (gc --delete) delete objects; launch
  // creates templates and groups.
  std::string scope_ = kStorageScope;
  std::string path_, email_, key_id_;
  std::unique_ptr<RsaSigningKey> key_;
  std::string token_uri_;
  std::unique_ptr<HttpClient> http_;
};

bool Exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

std::unique_ptr<TokenProvider> MakeCommandTokenProvider(std::string command, const Clock& clock,
                                                        std::chrono::milliseconds timeout) {
  return std::make_unique<CommandTokens>(std::move(command), clock, timeout);
}

std::string FindAdcFile() {
  if (const char* p = std::getenv("GOOGLE_APPLICATION_CREDENTIALS"); p != nullptr && *p != '\0') return p;
  std::string dir;
  if (const char* c = std::getenv("CLOUDSDK_CONFIG"); c != nullptr && *c != '\0') {
    dir = c;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    dir = std::string(h) + "/.config/gcloud";
  }
  if (dir.empty()) return "";
  auto path = dir + "/application_default_credentials.json";
  return Exists(path) ? path : "";
}

StatusOr<std::unique_ptr<TokenProvider>> MakeAdcTokenProvider(const std::string& path, const Clock& clock,
                                                              std::function<std::unique_ptr<HttpClient>()> make_http,
                                                              const std::string& scope) {
  std::ifstream in(path);
  if (!in) return ErrnoToStatus(errno, "reading credentials " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto text = ss.str();
  if (text.size() > (1u << 20)) return InvalidArgumentError(path + ": larger than 1 MiB; not a credentials file");
  auto j = Json::parse(text, nullptr, false);
  if (!j.is_object()) return InvalidArgumentError(path + ": not a JSON object; not a credentials file");
  auto str = [&](const char* k) -> std::string {
    auto it = j.find(k);
    return it != j.end() && it->is_string() ? it->get<std::string>() : "";
  };
  auto type = str("type");
  if (type != "authorized_user" && type != "service_account") {
    return InvalidArgumentError(fmt::format(
        "{}: credentials of type \"{}\" are not supported (authorized_user and service_account are; or use "
        "--access-token-command \"gcloud auth print-access-token\")",
        path, output::EscapeInvalidUtf8(type)));
  }
  std::string token_uri = str("token_uri").empty() ? kGoogleTokenUri : str("token_uri");
  if (!StartsWith(token_uri, "https://") && !StartsWith(token_uri, "http://")) {
    return InvalidArgumentError(path + ": token_uri is not an http(s) URL");
  }
  if (type == "service_account") {
    for (const char* k : {"client_email", "private_key"}) {
      if (str(k).empty()) return InvalidArgumentError(fmt::format("{}: \"{}\" is missing or not a string", path, k));
    }
    auto key = RsaSigningKey::FromPem(str("private_key"), path);
    if (!key.ok()) return key.status();
    auto tokens = std::make_unique<ServiceAccountTokens>(path, str("client_email"), str("private_key_id"), std::move(*key),
                                                         token_uri, clock, make_http());
    tokens->SetScope(scope);
    return std::unique_ptr<TokenProvider>(std::move(tokens));
  }
  for (const char* k : {"client_id", "client_secret", "refresh_token"}) {
    if (str(k).empty()) return InvalidArgumentError(fmt::format("{}: \"{}\" is missing or not a string", path, k));
  }
  return std::unique_ptr<TokenProvider>(std::make_unique<AuthorizedUserTokens>(
      path, str("client_id"), str("client_secret"), str("refresh_token"), token_uri, clock, make_http()));
}

}  // namespace spotvisor
