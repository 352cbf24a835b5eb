#include "app/laptop_credentials.h"

#include <chrono>

#include "common/clock.h"
#include "http/http_client.h"
#include "metadata/metadata_client.h"

namespace spotvisor {

StatusOr<std::unique_ptr<TokenProvider>> LaptopGoogleCredentials(const std::string& access_token_command,
                                                                 const std::string& scope) {
  static const SystemClock clock;
  if (!access_token_command.empty()) return MakeCommandTokenProvider(access_token_command, clock);
  if (auto adc = FindAdcFile(); !adc.empty()) return MakeAdcTokenProvider(adc, clock, MakeCurlHttpClient, scope);
  auto endpoint = MetadataEndpointFromEnv();
  endpoint.connect_timeout = std::chrono::milliseconds(1000);
  auto client = MakeMetadataClient(endpoint, MakeCurlHttpClient(), MakeCurlHttpClient);
  if (client->Get("instance/service-accounts/default/email").ok()) {
    return std::unique_ptr<TokenProvider>(std::make_unique<MetadataTokenProvider>(std::move(client), clock));
  }
  return PermissionDeniedError(
      "no credentials: run `gcloud auth application-default login`, set GOOGLE_APPLICATION_CREDENTIALS, or pass "
      "--access-token-command \"gcloud auth print-access-token\"");
}

}  // namespace spotvisor
