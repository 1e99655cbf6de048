#pragma once
// peer_signer: how instances of one group recognise each other's requests.
//
// Requests one instance sends another on a caller's behalf (a forwarded lookup, one
// owner's part of a range, count or batch, the local view for /v1/cluster) carry the
// internal dialect: the X-Kstate-Hop header and internal parameters (`partitions=`,
// `after=`, the part media type). Only peers may speak it (DESIGN.md invariant 10), so
// each such request is signed with a secret every instance of the group shares:
//
//   X-Kstate-Peer: v1;t=<unix ms>;s=<hex HMAC-SHA256>
//
// over "v1\n<t>\n<method>\n<target>\n<hex SHA-256 of the body>". A request whose
// signature does not verify, or whose time is more than `max_skew` from this
// instance's clock, is not a peer's. The caller's token is never sent to a peer: the
// instance that received the request checked its scopes, and the signature vouches
// for that check.
//
// Thread safety: immutable after construction; share it freely.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "http/message.h"

namespace kstate::server::api {

// The header carrying the signature.
inline constexpr std::string_view peer_header = "X-Kstate-Peer";

class peer_signer {
 public:
  // `secret`: at least 16 bytes, the same on every instance of the group.
  explicit peer_signer(std::string secret, std::chrono::milliseconds max_skew = std::chrono::seconds(60));

  // The X-Kstate-Peer value for a request, signed at `now_ms` (unix ms).
  std::string sign(std::string_view method, std::string_view target, std::string_view body, int64_t now_ms) const;
  // True when `req` carries a valid signature made within max_skew of `now_ms`.
  bool verify(const http::request& req, int64_t now_ms) const;

  static int64_t now_ms();

 private:
  std::string mac(int64_t t, std::string_view method, std::string_view target, std::string_view body) const;

  // OpenSSL state made once: the SHA-256 digest and an HMAC context already keyed with
  // the secret, copied for each signature (keying and fetching the algorithms again
  // for every request costs more than the hashing).
  struct keyed;
  std::shared_ptr<const keyed> keyed_;
  std::chrono::milliseconds max_skew_;
};

}  // namespace kstate::server::api
