// Bearer tokens for Google APIs. On GCE they come from the metadata server
// (the VM's service account); they last about an hour and are refreshed a
// few minutes before they expire. Tokens are never logged.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "metadata/metadata_client.h"

namespace spotvisor {

class TokenProvider {
 public:
  virtual ~TokenProvider() = default;
  // The Authorization header value ("Bearer ..."), or "" for no auth.
  virtual StatusOr<std::string> AuthorizationHeader() = 0;
};

// STORAGE_EMULATOR_HOST turns authentication off, as in Google's libraries.
std::unique_ptr<TokenProvider> MakeNoAuthTokenProvider();

class MetadataTokenProvider final : public TokenProvider {
 public:
  MetadataTokenProvider(std::unique_ptr<MetadataClient> client, const Clock& clock)
      : client_(std::move(client)), clock_(clock) {}
  StatusOr<std::string> AuthorizationHeader() override;

 private:
  std::unique_ptr<MetadataClient> client_;
  const Clock& clock_;
  std::mutex mu_;
  std::string header_;
  SteadyTime refresh_at_{};
};

}  // namespace spotvisor
