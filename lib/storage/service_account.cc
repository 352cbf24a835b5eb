#include "storage/service_account.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <fmt/format.h>

#include "storage/crc32c.h"

namespace spotvisor {

std::string Base64UrlEncode(std::string_view bytes) {
  std::string out = Base64Encode(bytes);
  while (!out.empty() && out.back() == '=') out.pop_back();
  for (char& c : out) {
    if (c == '+') c = '-';
    if (c == '/') c = '_';
  }
  return out;
}

struct RsaSigningKey::Impl {
  EVP_PKEY* pkey = nullptr;
  ~Impl() { EVP_PKEY_free(pkey); }
};

RsaSigningKey::RsaSigningKey(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RsaSigningKey::~RsaSigningKey() = default;

StatusOr<std::unique_ptr<RsaSigningKey>> RsaSigningKey::FromPem(std::string_view pem, std::string_view what) {
  if (pem.empty() || pem.size() > (64u << 10)) {
    return InvalidArgumentError(fmt::format("{}: private_key is empty or too large to be a PEM key", what));
  }
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return InternalError("BIO_new_mem_buf failed");
  // No passphrase callback: a key file with an encrypted key is refused
  // rather than prompting on a terminal.
  auto no_passphrase = [](char*, int, int, void*) -> int { return 0; };
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(bio, nullptr, no_passphrase, nullptr);
  BIO_free(bio);
  // OpenSSL's error queue may name the PEM parser's trouble; it never holds
  // key material, but the message is ours and says what to do.
  ERR_clear_error();
  if (pkey == nullptr) {
    return InvalidArgumentError(
        fmt::format("{}: private_key is not a PEM private key (a key file from `gcloud iam service-accounts keys "
                    "create` holds \"-----BEGIN PRIVATE KEY-----...\")",
                    what));
  }
  auto impl = std::make_unique<Impl>();
  impl->pkey = pkey;
  if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_RSA) {
    return InvalidArgumentError(fmt::format("{}: private_key is not an RSA key (Google's service-account keys are RSA, "
                                            "signed RS256)",
                                            what));
  }
  if (EVP_PKEY_get_bits(pkey) < 2048) {
    return InvalidArgumentError(fmt::format("{}: private_key is a {}-bit RSA key; Google issues 2048-bit keys",
                                            what, EVP_PKEY_get_bits(pkey)));
  }
  return std::unique_ptr<RsaSigningKey>(new RsaSigningKey(std::move(impl)));
}

StatusOr<std::string> RsaSigningKey::SignRs256(std::string_view data) const {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) return InternalError("EVP_MD_CTX_new failed");
  std::string sig;
  std::size_t len = 0;
  bool ok = EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, impl_->pkey) == 1 &&
            EVP_DigestSign(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1;
  if (ok) {
    sig.resize(len);
    ok = EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                        reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1;
    sig.resize(len);
  }
  EVP_MD_CTX_free(ctx);
  ERR_clear_error();
  if (!ok) return InternalError("signing the service-account assertion failed (OpenSSL)");
  return sig;
}

StatusOr<std::string> MakeRs256Jwt(const RsaSigningKey& key, std::string_view header_json,
                                   std::string_view claims_json) {
  std::string signing_input = Base64UrlEncode(header_json) + "." + Base64UrlEncode(claims_json);
  auto sig = key.SignRs256(signing_input);
  if (!sig.ok()) return sig.status();
  return signing_input + "." + Base64UrlEncode(*sig);
}

}  // namespace spotvisor
