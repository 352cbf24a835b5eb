// Bearer tokens for Google APIs. On GCE they come from the metadata server
// (the VM's service account); they last about an hour and are refreshed a
// few minutes before they expire. Tokens are never logged.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "metadata/metadata_client.h"

namespace spotvisor {

class TokenProvider {
 public:
  virtual ~TokenProvider() = default;
  // The Authorization header value ("Bearer ..."), or "" for no auth. A
  // token fetch is bounded by `ctx` (its deadline, its cancellation).
  virtual StatusOr<std::string> AuthorizationHeader(const CallContext& ctx) = 0;
  StatusOr<std::string> AuthorizationHeader() { return AuthorizationHeader(Background()); }
};

// STORAGE_EMULATOR_HOST turns authentication off, as in Google's libraries.
std::unique_ptr<TokenProvider> MakeNoAuthTokenProvider();

class MetadataTokenProvider final : public TokenProvider {
 public:
  MetadataTokenProvider(std::unique_ptr<MetadataClient> client, const Clock& clock)
      : client_(std::move(client)), clock_(clock) {}
  using TokenProvider::AuthorizationHeader;
  StatusOr<std::string> AuthorizationHeader(const CallContext& ctx) override;

 private:
  std::unique_ptr<MetadataClient> client_;
  const Clock& clock_;
  std::mutex mu_;
  std::string header_;
  SteadyTime refresh_at_{};
};

}  // namespace spotvisor
