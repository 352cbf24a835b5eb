// How the laptop commands (runs, pull, gc, stop, launch) authenticate to
// Google, in the order Google's tools use: --access-token-command, else
// Application Default Credentials (a user login, or a service-account key
// asked for `scope`), else the metadata server (on a VM, or with
// GCE_METADATA_HOST).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "storage/token_provider.h"
#include "storage/user_credentials.h"

namespace spotvisor {

inline constexpr char kCloudPlatformScope[] = "https://www.googleapis.com/auth/cloud-platform";

StatusOr<std::unique_ptr<TokenProvider>> LaptopGoogleCredentials(const std::string& access_token_command,
                                                                 const std::string& scope = kStorageScope);

}  // namespace spotvisor
