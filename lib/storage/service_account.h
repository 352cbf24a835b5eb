// Service-account keys (the JSON file `gcloud iam service-accounts keys
// create` writes), for the laptop commands' Application Default Credentials:
// an RS256-signed JWT assertion exchanged for an access token at the key's
// token_uri (RFC 7523, as Google's "OAuth 2.0 for Server to Server
// Applications" describes it). The private key never leaves this file's
// objects: it is not logged, printed or put in an error message.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace spotvisor {

// Base64url without padding (RFC 7515 section 2), the JWT encoding.
std::string Base64UrlEncode(std::string_view bytes);

// An RSA private key read from PEM (PKCS#8 "BEGIN PRIVATE KEY", as Google's
// key files hold it, or PKCS#1 "BEGIN RSA PRIVATE KEY").
class RsaSigningKey {
 public:
  // `what` names the key in errors (e.g. the file it came from); the PEM text
  // itself never appears in one.
  static StatusOr<std::unique_ptr<RsaSigningKey>> FromPem(std::string_view pem, std::string_view what);
  ~RsaSigningKey();
  RsaSigningKey(const RsaSigningKey&) = delete;
  RsaSigningKey& operator=(const RsaSigningKey&) = delete;

  // RSASSA-PKCS1-v1_5 with SHA-256 (JWS "RS256") over `data`.
  StatusOr<std::string> SignRs256(std::string_view data) const;

 private:
  struct Impl;
  explicit RsaSigningKey(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// header.claims.signature, each part base64url. `header_json` and
// `claims_json` are serialised JSON objects.
StatusOr<std::string> MakeRs256Jwt(const RsaSigningKey& key, std::string_view header_json,
                                   std::string_view claims_json);

}  // namespace spotvisor
