#include "api/peer_auth.h"

#include "server/api.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/sha.h>

#include <charconv>
#include <memory>
#include <stdexcept>

namespace kstate::server::api {
namespace {

std::string to_hex(const unsigned char* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

}  // namespace

struct peer_signer::keyed {
  EVP_MD* sha256 = nullptr;
  EVP_MAC* hmac = nullptr;
  EVP_MAC_CTX* base = nullptr;  // keyed, never updated: only copied (a read, safe from any thread)

  explicit keyed(const std::string& secret) {
    sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (sha256 && hmac) base = EVP_MAC_CTX_new(hmac);
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_END};
    if (!base || !EVP_MAC_init(base, reinterpret_cast<const unsigned char*>(secret.data()), secret.size(), params)) {
      release();
      throw std::runtime_error("OpenSSL has no usable HMAC-SHA256");
    }
  }
  ~keyed() { release(); }
  keyed(const keyed&) = delete;
  keyed& operator=(const keyed&) = delete;

  void release() {
    EVP_MAC_CTX_free(base);
    EVP_MAC_free(hmac);
    EVP_MD_free(sha256);
    base = nullptr;
    hmac = nullptr;
    sha256 = nullptr;
  }
};

peer_signer::peer_signer(std::string secret, std::chrono::milliseconds max_skew) : max_skew_(max_skew) {
  if (secret.size() < 16) throw std::invalid_argument("the peer secret must be at least 16 bytes");
  keyed_ = std::make_shared<const keyed>(secret);
}

int64_t peer_signer::now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string peer_signer::mac(int64_t t, std::string_view method, std::string_view target, std::string_view body) const {
  unsigned char body_hash[SHA256_DIGEST_LENGTH];
  if (!EVP_Digest(body.data(), body.size(), body_hash, nullptr, keyed_->sha256, nullptr)) return {};
  std::string msg = "v1\n" + std::to_string(t) + "\n";
  msg.append(method).append("\n").append(target).append("\n").append(to_hex(body_hash, sizeof body_hash));
  std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(EVP_MAC_CTX_dup(keyed_->base), &EVP_MAC_CTX_free);
  unsigned char out[EVP_MAX_MD_SIZE];
  std::size_t len = 0;
  if (!ctx || !EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(msg.data()), msg.size()) ||
      !EVP_MAC_final(ctx.get(), out, &len, sizeof out))
    return {};
  return to_hex(out, len);
}

std::string peer_signer::sign(std::string_view method, std::string_view target, std::string_view body,
                              int64_t now_ms) const {
  return "v1;t=" + std::to_string(now_ms) + ";s=" + mac(now_ms, method, target, body);
}

bool peer_signer::verify(const http::request& req, int64_t now) const {
  auto value = req.header(peer_header);
  if (!value) return false;
  std::string_view v = *value;
  // v1;t=<digits>;s=<64 hex>
  if (v.substr(0, 5) != "v1;t=") return false;
  v.remove_prefix(5);
  auto semi = v.find(";s=");
  if (semi == std::string_view::npos) return false;
  int64_t t = 0;
  auto digits = v.substr(0, semi);
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), t);
  if (ec != std::errc() || ptr != digits.data() + digits.size() || digits.empty()) return false;
  if (t < now - max_skew_.count() || t > now + max_skew_.count()) return false;
  auto given = v.substr(semi + 3);
  auto want = mac(t, req.method, req.target, req.body);
  return !want.empty() && given.size() == want.size() && CRYPTO_memcmp(given.data(), want.data(), want.size()) == 0;
}

}  // namespace kstate::server::api

namespace kstate::server {

void peer_secret::set(std::string secret) {
  std::lock_guard lock(mu_);
  secret_ = std::make_shared<const std::string>(std::move(secret));
}

std::shared_ptr<const std::string> peer_secret::get() const {
  std::lock_guard lock(mu_);
  return secret_;
}

}  // namespace kstate::server
