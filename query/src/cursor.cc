#include "query/cursor.h"

#include <xxhash.h>

#include "query/key_format.h"

namespace kstate::query {
namespace {

constexpr char version = 1;

uint64_t checksum(std::string_view payload, std::string_view fingerprint) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0x6b73746174650001ull);
  XXH64_update(st, payload.data(), payload.size());
  XXH64_update(st, fingerprint.data(), fingerprint.size());
  auto h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

}  // namespace

std::string encode_cursor(const cursor& c, std::string_view fingerprint) {
  std::string payload;
  payload.push_back(version);
  payload.append(c.last_key);
  uint64_t h = checksum(payload, fingerprint);
  for (int i = 0; i < 8; ++i) payload.push_back(static_cast<char>(h >> (56 - 8 * i)));
  return base64url_encode(payload);
}

result<cursor> decode_cursor(std::string_view token, std::string_view fingerprint) {
  auto raw = base64url_decode(token);
  if (!raw.ok() || raw->size() < 9) return status::invalid_argument("invalid cursor");
  std::string_view body(raw->data(), raw->size() - 8);
  uint64_t h = 0;
  for (size_t i = raw->size() - 8; i < raw->size(); ++i) h = (h << 8) | static_cast<unsigned char>((*raw)[i]);
  if (body[0] != version) return status::invalid_argument("invalid cursor (unknown version)");
  if (h != checksum(body, fingerprint))
    return status::invalid_argument("invalid cursor (damaged, or made for a different query)");
  return cursor{std::string(body.substr(1))};
}

}  // namespace kstate::query
