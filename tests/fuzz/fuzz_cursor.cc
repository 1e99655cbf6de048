// Fuzz target: range cursors (query/src/cursor.cc).
//
// Input: "<fingerprint>\n<token>" (without a newline: an empty fingerprint). A token
// that decodes must be exactly what encode_cursor() makes for the key it decodes to
// (up to base64url padding), so a cursor has one spelling; and any key round-trips
// through encode and decode with the same fingerprint and is refused with another.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "query/cursor.h"

using kstate::query::cursor;
using kstate::query::decode_cursor;
using kstate::query::encode_cursor;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nl = input.find('\n');
  const std::string_view fingerprint = nl == std::string_view::npos ? std::string_view() : input.substr(0, nl);
  const std::string_view token = nl == std::string_view::npos ? input : input.substr(nl + 1);

  auto decoded = decode_cursor(token, fingerprint);
  if (decoded.ok()) {
    const std::string_view unpadded = token.substr(0, token.find('='));
    FUZZ_CHECK(encode_cursor(*decoded, fingerprint) == unpadded);
  }

  // The token's bytes as a key: decode(encode(key)) == key.
  const cursor c{std::string(token)};
  const std::string made = encode_cursor(c, fingerprint);
  auto back = decode_cursor(made, fingerprint);
  FUZZ_CHECK(back.ok() && back->last_key == c.last_key);
  // Another query's fingerprint, or a damaged token, is refused. (A checksum collision
  // is possible in principle, at 2^-64 per try.)
  FUZZ_CHECK(!decode_cursor(made, std::string(fingerprint) + "x").ok());
  std::string damaged = made;
  damaged[damaged.size() / 2] = damaged[damaged.size() / 2] == 'A' ? 'B' : 'A';
  FUZZ_CHECK(!decode_cursor(damaged, fingerprint).ok());
  return 0;
}
