// AWS Signature Version 4 for requests to S3 (and the EC2 query API), in
// the Authorization-header form AWS's "Signature Calculations for the
// Authorization Header" describes. Written here rather than through
// libcurl's CURLOPT_AWS_SIGV4 because the signer must cover what curl 7.88
// leaves to the caller (the session-token header, a payload hash we choose:
// UNSIGNED-PAYLOAD for bodies already protected by a crc32c checksum) and
// be testable against AWS's published examples without a network.
// Secrets never leave this file's functions: not logged, not in errors.
#pragma once

#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"
#include "http/http_client.h"

namespace spotvisor {

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: long-term keys
};

inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);
// HMAC-SHA256 (raw bytes).
std::string HmacSha256(std::string_view key, std::string_view data);

// AWS's URI encoding: every byte but A-Z a-z 0-9 - . _ ~ as %XX (upper
// case); '/' kept when `keep_slash` (object keys in a path).
std::string AwsUriEncode(std::string_view s, bool keep_slash);

// Signs `req` in place. `req.url` is "http[s]://HOST[:PORT]/PATH[?QUERY]"
// with PATH and QUERY already encoded with AwsUriEncode (so the canonical
// request is the URL as sent). Adds Host, x-amz-date, x-amz-content-sha256
// (`payload_hash`: the hex SHA-256 of the body, or kUnsignedPayload),
// x-amz-security-token when there is a session token, and Authorization;
// every header in `req.headers` is signed. `service`: "s3", "ec2", ...
Status SignV4(HttpRequest& req, const AwsCredentials& creds, std::string_view region, std::string_view service,
              std::string_view payload_hash, WallTime now);

}  // namespace spotvisor
