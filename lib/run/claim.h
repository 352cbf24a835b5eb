// Who is live on a run (issue #28): the first part of the run's record in
// the bucket. Every VM working on a run (in a gang, every rank) holds a claim
// from before its restore until its run ends there, renewed well inside its
// lifetime; a claim that nobody renews expires by itself, so nothing has to
// remember to clear it. `spotvisor gc` keeps a run while any claim on it is
// live, and `spotvisor runs` shows such a run as running.
//
//   RUN_ID/claims/INSTANCE.TOKEN.json
//     {"version": 1, "run_id", "instance", "token", "state", "claimed_at",
//      "renewed_at", "expires_at", "ttl_s"}
//
// TOKEN is drawn afresh by every spotvisor process, so no later boot, restart
// or other VM writes the same name; each claim has one writer.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "storage/object_store.h"

namespace spotvisor {

inline constexpr char kClaimsDir[] = "claims/";
// A laptop's clock and the VM's may differ: a claim counts as live this long
// past its expiry, so a run is never collected on a clock's say-so.
inline constexpr std::chrono::minutes kClaimSkew{2};

struct Claim {
  std::string name;  // the object, relative to RUN_ID/
  std::string run_id, instance, token, state;
  WallTime claimed_at, renewed_at, expires_at;
  std::chrono::seconds ttl{0};
  bool LiveAt(WallTime now) const { return now < expires_at + kClaimSkew; }
};

// The claim's JSON, and back (every field checked: it comes from the bucket).
std::string ClaimJson(const Claim& c);
StatusOr<Claim> ParseClaim(const std::string& name, std::string_view text);

// This process's claim on one run. Thread-safe.
class RunClaim {
 public:
  // `run_store` is rooted at PREFIX/RUN_ID.
  RunClaim(std::shared_ptr<ObjectStore> run_store, std::string run_id, std::string instance, std::chrono::seconds ttl,
           const Clock& clock);
  // Writes the claim (the first call creates it) saying what this VM is
  // doing ("restoring", "training", "syncing"); expires ttl from now.
  Status Renew(const std::string& state, const CallContext& ctx);
  // The run ended on this VM: the claim goes.
  Status Release(const CallContext& ctx);
  const std::string& name() const { return claim_.name; }
  const std::string& token() const { return claim_.token; }
  std::chrono::seconds ttl() const { return claim_.ttl; }

 private:
  std::shared_ptr<ObjectStore> store_;
  const Clock& clock_;
  std::mutex mu_;
  Claim claim_;
  bool written_ = false;
};

// The claims under a run (objects named RUN_ID/claims/...), read from
// `store` rooted above the run; unreadable or malformed ones are reported
// in `problems` and treated as live (gc must not delete on a doubt).
struct RunClaims {
  std::vector<Claim> claims;
  std::vector<std::string> problems;
  bool AnyLive(WallTime now) const;
};
RunClaims ReadClaims(ObjectStore& store, const std::string& run_id, const std::vector<ObjectInfo>& run_objects,
                     const CallContext& ctx);

}  // namespace spotvisor
