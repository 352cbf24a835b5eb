// Credentials off GCE, as Google's own tools find them, for the commands a
// person runs on a laptop (`spotvisor runs`, `pull`, `gc`): a command that
// prints an access token (`gcloud auth print-access-token`), or Application
// Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, else gcloud's
// application_default_credentials.json). Tokens, refresh tokens and private
// keys are never printed or logged.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "http/http_client.h"
#include "storage/token_provider.h"

namespace spotvisor {

// Runs `command` with /bin/sh -c (at most `timeout`); its stdout, trimmed,
// is the token. Asked again every 10 minutes (gcloud's tokens last an hour).
std::unique_ptr<TokenProvider> MakeCommandTokenProvider(std::string command, const Clock& clock,
                                                        std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Where ADC lives: $GOOGLE_APPLICATION_CREDENTIALS; else
// $CLOUDSDK_CONFIG/application_default_credentials.json, or
// ~/.config/gcloud/application_default_credentials.json, if it exists; else "".
std::string FindAdcFile();

// A provider for an ADC file. `authorized_user` (what `gcloud auth
// application-default login` writes: client_id, client_secret, refresh_token,
// optional token_uri) is exchanged at token_uri (default Google's); a
// `service_account` key (client_email, private_key, optional private_key_id
// and token_uri) signs an RS256 assertion for the devstorage.read_write scope
// and exchanges that (storage/service_account.h). Any other content is an
// error naming the file and what is wrong; the key is read (and a bad one
// refused) here, before any request.
// `scope`: what a service-account key's token is for (an authorized_user's
// refresh token keeps the scopes of its login).
inline constexpr char kStorageScope[] = "https://www.googleapis.com/auth/devstorage.read_write";
StatusOr<std::unique_ptr<TokenProvider>> MakeAdcTokenProvider(
    const std::string& path, const Clock& clock,
    std::function<std::unique_ptr<HttpClient>()> make_http = MakeCurlHttpClient, const std::string& scope = kStorageScope);

}  // namespace spotvisor
