#include "compute/compute_client.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "output/utf8.h"
#include "storage/transfer.h"
#include "retry/retry_loop.h"
#include "common/strings.h"
#include "common/json_fields.h"

namespace spotvisor {
namespace {

class ComputeClientImpl : public ComputeClient {
 public:
  ComputeClientImpl(std::string endpoint, InstanceRef instance, std::unique_ptr<TokenProvider> tokens, Sleeper& sleeper)
      : endpoint_(std::move(endpoint)), i_(std::move(instance)), tokens_(std::move(tokens)), sleeper_(sleeper),
        http_(MakeCurlHttpClient()) {}

  Status StopInstance(const CallContext& ctx) override {
    return Call("POST", InstanceUrl() + "/stop", "", "stop", "compute.instances.stop", ctx).status();
  }
  Status DeleteInstance(const CallContext& ctx) override {
    return Call("DELETE", InstanceUrl(), "", "delete", "compute.instances.delete", ctx).status();
  }

 protected:
  std::string InstanceUrl() const {
    return fmt::format("{}/projects/{}/zones/{}/instances/{}", endpoint_, UrlEncode(i_.project), UrlEncode(i_.zone),
                       UrlEncode(i_.name));
  }

  // Stop and delete are idempotent (a second request finds the operation
  // under way or the VM gone), so transient failures are retried, briefly:
  // if the API stays unreachable the caller powers off instead.
  // The answer's JSON (an operation) on success.
  StatusOr<nlohmann::json> Call(const std::string& method, const std::string& url, const std::string& body,
                                const std::string& verb, const char* permission, const CallContext& ctx) {
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
    nlohmann::json answer;
    auto done = RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [&]() -> Status {
      if (auto s = ctx.Check(Subject(verb)); !s.ok()) return s;
      auto auth = tokens_->AuthorizationHeader(ctx);
      if (!auth.ok()) return auth.status();
      HttpRequest req;
      req.method = method;
      req.url = url;
      req.timeout = ctx.Remaining(std::chrono::seconds(30));
      if (req.timeout.count() <= 0) return DeadlineExceededError(Subject(verb) + ": out of time");
      req.connect_timeout = std::min(req.connect_timeout, req.timeout);
      if (!auth->empty()) req.headers.emplace_back("Authorization", *auth);
      if (method == "POST") req.headers.emplace_back("Content-Type", "application/json");
      req.body = body;
      auto r = http_->Perform(req);
      if (!r.ok()) return r.status();
      auto what = Subject(verb);
      if (r->status == 200) {
        answer = nlohmann::json::parse(r->body, nullptr, false);
        return OkStatus();
      }
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
              "{}: permission denied (HTTP {}: {}). {} {} (e.g. roles/compute.{}) on {}{}", what, r->status, server,
              i_.name.empty() ? "The credentials need" : "The VM's service account needs", permission,
              i_.name.empty() ? "viewer" : "instanceAdmin.v1", Scope(),
              i_.name.empty() ? "" : " and the VM an access scope that allows it (--scopes=compute-rw or cloud-platform)"));
        case 404: return NotFoundError(fmt::format("{}: not found (HTTP 404: {})", what, server));
        default:
          if (r->status == 429 || r->status >= 500) return UnavailableError(fmt::format("{}: HTTP {}: {}", what, r->status, server));
          return InvalidArgumentError(fmt::format("{}: HTTP {}: {}", what, r->status, server));
      }
    });
    if (!done.ok()) return done;
    return answer;
  }

  virtual std::string Subject(const std::string& verb) const {
    return fmt::format("{} instance {} ({}/{})", verb, i_.name, i_.project, i_.zone);
  }
  virtual std::string Scope() const { return "the VM"; }

  std::string endpoint_;
  const InstanceRef i_;
  std::unique_ptr<TokenProvider> tokens_;
  Sleeper& sleeper_;
  std::unique_ptr<HttpClient> http_;
};

// Leaving the group: deleteInstances on this VM, which also lowers the
// group's target size, then the operation followed for a while so that a
// refusal that comes in the operation (not in the answer) is seen.
class MigClient final : public ComputeClientImpl, public GroupClient {
 public:
  MigClient(std::string endpoint, InstanceGroup g, InstanceRef self, std::unique_ptr<TokenProvider> tokens, Sleeper& sleeper)
      : ComputeClientImpl(std::move(endpoint), std::move(self), std::move(tokens), sleeper), g_(std::move(g)) {}

  std::string LeaveCall() const override {
    return g_.kind == InstanceGroup::Kind::kRegionalMig ? "regionInstanceGroupManagers.deleteInstances"
                                                         : "instanceGroupManagers.deleteInstances";
  }

  Status Leave(const CallContext& ctx) override {
    // skipInstancesOnValidationError: a second request (after a lost
    // answer) finds this VM already being deleted and changes nothing.
    nlohmann::json body = {{"instances", {fmt::format("zones/{}/instances/{}", i_.zone, i_.name)}},
                           {"skipInstancesOnValidationError", true}};
    auto op = Call("POST", fmt::format("{}/{}/deleteInstances", endpoint_, GroupPath()), body.dump(), "leave",
                   "compute.instanceGroupManagers.update", ctx);
    if (!op.ok()) return op.status();
    return Follow(*op, GroupScope(), "leave", false, ctx);
  }

  StatusOr<GroupState> State(const CallContext& ctx) override {
    GroupState state;
    auto group = Call("GET", fmt::format("{}/{}", endpoint_, GroupPath()), "", "read", "compute.instanceGroupManagers.get", ctx);
    if (group.status().code() == StatusCode::kNotFound) {
      state.gone = true;
      return state;
    }
    if (!group.ok()) return group.status();
    state.target = static_cast<int>(JsonInt(*group, "targetSize", 0));
    auto members = Call("POST", fmt::format("{}/{}/listManagedInstances", endpoint_, GroupPath()), "", "list the VMs of",
                        "compute.instanceGroupManagers.get", ctx);
    if (!members.ok()) return members.status();
    if (members->is_object() && members->contains("managedInstances") && (*members)["managedInstances"].is_array()) {
      state.instances = static_cast<int>((*members)["managedInstances"].size());
    }
    return state;
  }

  Status LeaveAndCleanUp(const CallContext& ctx, std::vector<std::string>* deleted, std::string* skipped) override {
    auto group = Call("GET", fmt::format("{}/{}", endpoint_, GroupPath()), "", "read", "compute.instanceGroupManagers.get", ctx);
    if (!group.ok() && skipped) *skipped = group.status().message();
    if (!group.ok() || JsonInt(*group, "targetSize", -1) != 1) return Leave(ctx);  // others stay
    std::string tpl = JsonString(*group, "instanceTemplate");
    if (auto at = tpl.find("projects/"); at != std::string::npos) tpl = tpl.substr(at);
    // Out of the group first, without being deleted: the group would
    // otherwise take its time deleting this VM, and the template cannot go
    // while the group uses it.
    nlohmann::json body = {{"instances", {fmt::format("zones/{}/instances/{}", i_.zone, i_.name)}}};
    auto op = Call("POST", fmt::format("{}/{}/abandonInstances", endpoint_, GroupPath()), body.dump(), "leave",
                   "compute.instanceGroupManagers.update", ctx);
    if (!op.ok()) return op.status();
    if (auto s = Follow(*op, GroupScope(), "leave", true, ctx); !s.ok()) return s;
    op = Call("DELETE", fmt::format("{}/{}", endpoint_, GroupPath()), "", "delete", "compute.instanceGroupManagers.delete", ctx);
    bool group_gone = op.ok() && Follow(*op, GroupScope(), "delete", true, ctx).ok();
    if (group_gone && deleted) deleted->push_back(g_.Path());
    if (group_gone && StartsWith(tpl, "projects/") && tpl.find("/global/instanceTemplates/") != std::string::npos) {
      op = Call("DELETE", fmt::format("{}/{}", endpoint_, tpl), "", "delete the template of", "compute.instanceTemplates.delete", ctx);
      auto global = fmt::format("projects/{}/global", UrlEncode(g_.project));
      if (op.ok() && Follow(*op, global, "delete the template of", true, ctx).ok() && deleted) deleted->push_back(tpl);
    }
    // No group brings it back now: this VM can go by itself.
    auto s = DeleteInstance(ctx);
    if (s.ok() && deleted) deleted->push_back(fmt::format("projects/{}/zones/{}/instances/{}", i_.project, i_.zone, i_.name));
    return s;
  }

 private:
  std::string GroupScope() const {
    return fmt::format("projects/{}/{}/{}", UrlEncode(g_.project),
                       g_.kind == InstanceGroup::Kind::kRegionalMig ? "regions" : "zones", UrlEncode(g_.location));
  }
  std::string GroupPath() const {
    return fmt::format("projects/{}/{}/{}/instanceGroupManagers/{}", UrlEncode(g_.project),
                       g_.kind == InstanceGroup::Kind::kRegionalMig ? "regions" : "zones", UrlEncode(g_.location),
                       UrlEncode(g_.name));
  }
  std::string Subject(const std::string& verb) const override {
    if (i_.name.empty()) return fmt::format("{} {}", verb, g_.Describe());  // a laptop's
    return fmt::format("{} {} with this VM ({})", verb, g_.Describe(), i_.name);
  }
  std::string Scope() const override { return "the group " + g_.Path(); }

  // Up to 10 s (and never past ctx's deadline; `until_done`: until the
  // deadline): an error in the operation is a refusal; an operation still
  // running at the end is the group at work (the VM goes when it is done),
  // or, `until_done`, not done in time.
  Status Follow(nlohmann::json op, const std::string& scope, const std::string& verb, bool until_done,
                const CallContext& ctx) {
    std::string name = op.is_object() && op.contains("name") && op["name"].is_string() ? op["name"].get<std::string>() : "";
    auto until = ctx.clock && !until_done ? ctx.clock->Now() + std::chrono::seconds(10) : SteadyTime::max();
    ContextSleeper sleeper(ctx, &sleeper_);
    for (;;) {
      if (!op.is_object()) return OkStatus();
      if (op.contains("error") && op["error"].is_object()) {
        std::string message = "the operation failed";
        auto const& errors = op["error"]["errors"];
        if (errors.is_array() && !errors.empty() && errors[0].is_object()) {
          std::string code = JsonString(errors[0], "code");
          std::string text = JsonString(errors[0], "message");
          message = output::EscapeInvalidUtf8(fmt::format("{}: {}", code, text).substr(0, 300));
        }
        return FailedPreconditionError(fmt::format("{}: {}", Subject(verb), message));
      }
      if (JsonString(op, "status") == "DONE" || name.empty()) return OkStatus();
      auto not_done = [&] {
        return until_done ? DeadlineExceededError(Subject(verb) + ": the operation did not finish in time") : OkStatus();
      };
      if (ctx.clock && ctx.clock->Now() >= until) return not_done();
      if (!sleeper.SleepFor(std::chrono::milliseconds(until_done ? 250 : 1000))) return not_done();
      auto next = Call("GET", fmt::format("{}/{}/operations/{}", endpoint_, scope, UrlEncode(name)), "", "follow: " + verb,
                       "compute.zoneOperations.get", ctx);
      if (!next.ok()) return until_done ? next.status() : OkStatus();  // accepted already; following it is a courtesy
      op = *std::move(next);
    }
  }

  InstanceGroup g_;
};

}  // namespace

std::unique_ptr<GroupClient> MakeMigClient(std::string endpoint, InstanceGroup group, InstanceRef self,
                                           std::unique_ptr<TokenProvider> tokens, Sleeper& sleeper) {
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return std::make_unique<MigClient>(std::move(endpoint), std::move(group), std::move(self), std::move(tokens), sleeper);
}

std::unique_ptr<ComputeClient> MakeComputeClient(std::string endpoint, InstanceRef instance,
                                                 std::unique_ptr<TokenProvider> tokens, Sleeper& sleeper) {
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return std::make_unique<ComputeClientImpl>(std::move(endpoint), std::move(instance), std::move(tokens), sleeper);
}

}  // namespace spotvisor
