#include "compute/compute_client.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "output/utf8.h"
#include "retry/retry_loop.h"
#include "common/strings.h"

namespace spotvisor {
namespace {

class ComputeClientImpl final : public ComputeClient {
 public:
  ComputeClientImpl(std::string endpoint, InstanceRef instance, std::unique_ptr<TokenProvider> tokens, Sleeper& sleeper)
      : endpoint_(std::move(endpoint)), i_(std::move(instance)), tokens_(std::move(tokens)), sleeper_(sleeper),
        http_(MakeCurlHttpClient()) {}

  Status StopInstance(const CallContext& ctx) override {
    return Call("POST", InstanceUrl() + "/stop", "stop", "compute.instances.stop", ctx);
  }
  Status DeleteInstance(const CallContext& ctx) override {
    return Call("DELETE", InstanceUrl(), "delete", "compute.instances.delete", ctx);
  }

 private:
  std::string InstanceUrl() const {
    return fmt::format("{}/projects/{}/zones/{}/instances/{}", endpoint_, UrlEncode(i_.project), UrlEncode(i_.zone),
                       UrlEncode(i_.name));
  }

  // Stop and delete are idempotent (a second request finds the operation
  // under way or the VM gone), so transient failures are retried, briefly:
  // if the API stays unreachable the caller powers off instead.
  Status Call(const std::string& method, const std::string& url, const char* verb, const char* permission,
              const CallContext& ctx) {
    LimitedErrorCountRetryPolicy retry(3);
    ExponentialBackoffPolicy backoff(std::chrono::milliseconds(500), std::chrono::seconds(4), 2.0);
    // Waits end at the deadline or on cancellation, as do requests.
    struct Bounded final : Sleeper {
      Bounded(const CallContext& c, Sleeper& s) : ctx(c), inner(s) {}
      bool SleepFor(std::chrono::milliseconds d) override {
        if (ctx.cancelled() || (ctx.deadline && ctx.Remaining(d) < d)) return false;
        return inner.SleepFor(d) && !ctx.cancelled();
      }
      const CallContext& ctx;
      Sleeper& inner;
    } sleeper(ctx, sleeper_);
    std::uint64_t sub = 0;
    if (ctx.cancel) sub = ctx.cancel->Subscribe([this] { http_->Cancel(); });
    struct Unsub {
      const CallContext& ctx;
      std::uint64_t id;
      ~Unsub() {
        if (ctx.cancel) ctx.cancel->Unsubscribe(id);
      }
    } unsub{ctx, sub};
    // Stopping or deleting this VM a second time has the effect of once (an
    // answer that the VM is already stopping or gone counts as done), so a
    // lost answer is retried.
    return RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [&]() -> Status {
      if (auto s = ctx.Check(fmt::format("{} instance {}", verb, i_.name)); !s.ok()) return s;
      auto auth = tokens_->AuthorizationHeader(ctx);
      if (!auth.ok()) return auth.status();
      HttpRequest req;
      req.method = method;
      req.url = url;
      req.timeout = ctx.Remaining(std::chrono::seconds(30));
      if (req.timeout.count() <= 0) return DeadlineExceededError(fmt::format("{} instance {}: out of time", verb, i_.name));
      req.connect_timeout = std::min(req.connect_timeout, req.timeout);
      if (!auth->empty()) req.headers.emplace_back("Authorization", *auth);
      if (method == "POST") req.headers.emplace_back("Content-Type", "application/json");
      auto r = http_->Perform(req);
      if (!r.ok()) return r.status();
      auto what = fmt::format("{} instance {} ({}/{})", verb, i_.name, i_.project, i_.zone);
      if (r->status == 200) return OkStatus();
      std::string server;
      auto j = nlohmann::json::parse(r->body, nullptr, false);
      if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
          j["error"]["message"].is_string()) {
        server = output::EscapeInvalidUtf8(j["error"]["message"].get<std::string>());
      }
      switch (r->status) {
        case 401:
        case 403:
          return PermissionDeniedError(fmt::format(
              "{}: permission denied (HTTP {}: {}). The VM's service account needs {} (e.g. roles/compute.instanceAdmin.v1) "
              "and the VM an access scope that allows it (--scopes=compute-rw or cloud-platform)",
              what, r->status, server, permission));
        case 404: return NotFoundError(fmt::format("{}: not found (HTTP 404: {})", what, server));
        default:
          if (r->status == 429 || r->status >= 500) return UnavailableError(fmt::format("{}: HTTP {}: {}", what, r->status, server));
          return InvalidArgumentError(fmt::format("{}: HTTP {}: {}", what, r->status, server));
      }
    });
  }

  std::string endpoint_;
  InstanceRef i_;
  std::unique_ptr<TokenProvider> tokens_;
  Sleeper& sleeper_;
  std::unique_ptr<HttpClient> http_;
};

}  // namespace

std::unique_ptr<ComputeClient> MakeComputeClient(std::string endpoint, InstanceRef instance,
                                                 std::unique_ptr<TokenProvider> tokens, Sleeper& sleeper) {
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return std::make_unique<ComputeClientImpl>(std::move(endpoint), std::move(instance), std::move(tokens), sleeper);
}

}  // namespace spotvisor
