#pragma once
// Bearer-token authentication for the query API, with per-store scopes.
//
// A token file lists SHA-256 hashes of tokens, never the tokens themselves (so reading
// the file does not give access), each with a name for logs and the scopes the token
// grants. `kstate token hash` prints the hash of a token. docs/security.md describes the
// format:
//
//   tokens:
//     - name: orders-dashboard        # shown in logs; never the token
//       sha256: 9f86d0...0a08         # 64 hex digits: SHA-256 of the token
//       stores: ["orders*", users]    # store names; "x*" is a prefix, "*" every store
//       cluster: true                 # may read /v1/cluster (default false)
//       metrics: false                # may read /metrics (default false)
//
// Threads: a token_authenticator is shared by every I/O thread; authenticate() is
// thread-safe (a reload swaps an immutable token list under a mutex).

#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kstate::server {

// SHA-256 of `data` as 64 lower-case hex digits.
std::string sha256_hex(std::string_view data);

// A new random token: 32 bytes from OpenSSL's CSPRNG, base64url without padding
// (43 characters).
std::string random_token();

// What one token may read.
struct token_scopes {
  // Store names the token may read; an entry ending in '*' is a prefix ("orders*"
  // matches "orders" and "orders-eu"), "*" alone matches every store.
  std::vector<std::string> stores;
  bool cluster = false;  // GET /v1/cluster
  bool metrics = false;  // GET /metrics, when auth.metrics is "token"

  bool store_allowed(std::string_view store) const;
};

struct token_entry {
  std::string name;                      // for logs and error messages; never the token
  std::array<unsigned char, 32> hash{};  // SHA-256 of the token
  token_scopes scopes;
};

// Parses a token file (YAML, format above). Every error names the entry and key;
// names and hashes must be unique.
result<std::vector<token_entry>> parse_token_file(const std::string& yaml_text, const std::string& source = "tokens");
result<std::vector<token_entry>> load_token_file(const std::string& path);

// The caller a valid token identifies.
struct principal {
  std::string name;
  token_scopes scopes;
};

// Checks bearer tokens against a token file. When built from a path it re-reads the
// file when its modification time changes (checked at most once a second), so tokens
// can be added or revoked without a restart; a file that no longer parses is logged
// and the previous tokens stay in force.
class token_authenticator {
 public:
  explicit token_authenticator(std::vector<token_entry> tokens);
  // Loads `path`; error when it cannot be read or parsed.
  static result<std::shared_ptr<token_authenticator>> from_file(const std::string& path);

  // The principal of an Authorization header value ("Bearer <token>"); null when the
  // header is missing, not a bearer token, or the token is unknown. The presented
  // token is hashed and compared with every entry's hash in constant time
  // (CRYPTO_memcmp, no early exit), so timing tells nothing about the hashes.
  std::shared_ptr<const principal> authenticate(std::optional<std::string_view> authorization) const;

  size_t size() const;

 private:
  struct table;
  void maybe_reload() const;

  std::string path_;  // empty: no reload
  mutable std::mutex mu_;
  mutable std::shared_ptr<const table> tokens_;               // guarded by mu_
  mutable std::chrono::steady_clock::time_point next_check_;  // guarded by mu_
  mutable long long mtime_ns_ = 0;                            // guarded by mu_
};

}  // namespace kstate::server
