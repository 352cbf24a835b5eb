#include "storage/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <ctime>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/strings.h"

namespace spotvisor {
namespace {

std::string Hex(std::string_view raw) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return out;
}

// Header values as AWS canonicalises them: trimmed, inner runs of spaces
// collapsed to one.
std::string CanonicalValue(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : Trim(v)) {
    if (c == ' ' || c == '\t') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

}  // namespace

std::string Sha256Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr);
  return Hex(std::string_view(reinterpret_cast<char*>(md), n));
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), md, &n);
  return std::string(reinterpret_cast<char*>(md), n);
}

std::string AwsUriEncode(std::string_view s, bool keep_slash) {
  // AWS's unreserved set is RFC 3986's, which UrlEncode keeps.
  if (!keep_slash) return UrlEncode(s);
  std::string out;
  for (auto const& segment : SplitOn(s, '/')) {
    out += UrlEncode(segment);
    out += '/';
  }
  out.pop_back();
  return out;
}

Status SignV4(HttpRequest& req, const AwsCredentials& creds, std::string_view region, std::string_view service,
              std::string_view payload_hash, WallTime now) {
  if (creds.access_key_id.empty() || creds.secret_access_key.empty()) {
    return FailedPreconditionError("no AWS credentials to sign the request with");
  }
  auto scheme = req.url.find("://");
  if (scheme == std::string::npos) return InvalidArgumentError("not an absolute URL: " + req.url);
  auto path_at = req.url.find('/', scheme + 3);
  std::string host = req.url.substr(scheme + 3, path_at == std::string::npos ? std::string::npos : path_at - scheme - 3);
  std::string path_query = path_at == std::string::npos ? "/" : req.url.substr(path_at);
  auto q = path_query.find('?');
  std::string path = path_query.substr(0, q);
  std::string query = q == std::string::npos ? "" : path_query.substr(q + 1);
  // The default port is not part of Host (curl leaves it out too).
  if (StartsWith(req.url, "http://") && EndsWith(host, ":80")) host.resize(host.size() - 3);
  if (StartsWith(req.url, "https://") && EndsWith(host, ":443")) host.resize(host.size() - 4);

  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  std::string amz_date = stamp;
  std::string date = amz_date.substr(0, 8);

  // Drop any earlier signature (a retried request is signed again).
  std::erase_if(req.headers, [](auto const& h) {
    auto n = Lower(h.first);
    return n == "authorization" || n == "host" || n == "x-amz-date" || n == "x-amz-content-sha256" ||
           n == "x-amz-security-token";
  });
  req.headers.emplace_back("Host", host);
  req.headers.emplace_back("x-amz-date", amz_date);
  req.headers.emplace_back("x-amz-content-sha256", std::string(payload_hash));
  if (!creds.session_token.empty()) req.headers.emplace_back("x-amz-security-token", creds.session_token);

  std::vector<std::pair<std::string, std::string>> canon;
  for (auto const& [k, v] : req.headers) canon.emplace_back(Lower(k), CanonicalValue(v));
  std::sort(canon.begin(), canon.end());
  std::string canonical_headers, signed_headers;
  for (std::size_t i = 0; i < canon.size(); ++i) {
    // Repeated names are joined with commas, in order.
    if (i > 0 && canon[i].first == canon[i - 1].first) {
      canonical_headers.insert(canonical_headers.size() - 1, "," + canon[i].second);
      continue;
    }
    canonical_headers += canon[i].first + ":" + canon[i].second + "\n";
    if (!signed_headers.empty()) signed_headers += ';';
    signed_headers += canon[i].first;
  }

  std::vector<std::pair<std::string, std::string>> params;
  for (auto const& part : SplitOn(query, '&')) {
    if (part.empty()) continue;
    auto eq = part.find('=');
    params.emplace_back(part.substr(0, eq), eq == std::string::npos ? "" : part.substr(eq + 1));
  }
  std::sort(params.begin(), params.end());
  std::string canonical_query;
  for (auto const& [k, v] : params) {
    if (!canonical_query.empty()) canonical_query += '&';
    canonical_query += k + "=" + v;
  }

  std::string canonical_request = fmt::format("{}\n{}\n{}\n{}\n{}\n{}", req.method, path, canonical_query,
                                              canonical_headers, signed_headers, payload_hash);
  std::string scope = fmt::format("{}/{}/{}/aws4_request", date, region, service);
  std::string to_sign = fmt::format("AWS4-HMAC-SHA256\n{}\n{}\n{}", amz_date, scope, Sha256Hex(canonical_request));
  std::string key = HmacSha256("AWS4" + creds.secret_access_key, date);
  key = HmacSha256(key, region);
  key = HmacSha256(key, service);
  key = HmacSha256(key, "aws4_request");
  std::string signature = Hex(HmacSha256(key, to_sign));
  req.headers.emplace_back("Authorization", fmt::format("AWS4-HMAC-SHA256 Credential={}/{}, SignedHeaders={}, Signature={}",
                                                        creds.access_key_id, scope, signed_headers, signature));
  return OkStatus();
}

}  // namespace spotvisor
