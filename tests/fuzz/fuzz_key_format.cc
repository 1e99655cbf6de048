// Fuzz target: the key format decoders (query/src/key_format.cc), on the same input
// text for every format: string, base64url, long and json.
//
// Each decoder is compared with a reference written here from its definition
// (RFC 3629 for UTF-8, RFC 4648 section 5 for base64url, a decimal int64 for long,
// nlohmann::json::accept for json), and the encoders must round-trip.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "query/key_format.h"

namespace {

using kstate::query::decode_key;

// The bound keys are decoded with (small, so that the fuzzer reaches it).
constexpr int kDepth = 8;
using kstate::query::key_format;

// UTF-8 by decoding each code point and checking it: shortest form, not a surrogate,
// at most U+10FFFF.
bool reference_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;  // truncated
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t shortest[] = {0, 0x80, 0x800, 0x10000};
    if (cp < shortest[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += 1 + extra;
  }
  return true;
}

// base64url: 6 bits per character, optional '=' padding to a multiple of four; the
// bits left over after the last whole byte must be zero (one spelling per value).
std::optional<std::string> reference_base64url(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && s[n - 1] == '=') --n;
  const size_t pad = s.size() - n;
  if (n % 4 == 1) return std::nullopt;
  if (pad != 0 && pad != (4 - n % 4) % 4) return std::nullopt;
  std::string out;
  uint32_t bits = 0;
  int nbits = 0;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[i];
    int v = -1;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '-') v = 62;
    else if (c == '_') v = 63;
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    nbits += 6;
    if (nbits >= 8) {
      nbits -= 8;
      out.push_back(static_cast<char>((bits >> nbits) & 0xFF));
    }
  }
  if ((bits & ((1u << nbits) - 1)) != 0) return std::nullopt;
  return out;
}

// A signed 64-bit decimal: optional '-', then digits, in range.
std::optional<int64_t> reference_long(std::string_view s) {
  size_t i = 0;
  const bool negative = !s.empty() && s[0] == '-';
  if (negative) ++i;
  if (i == s.size()) return std::nullopt;
  // Accumulated as a negative number: its range includes INT64_MIN.
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    const int d = s[i] - '0';
    if (v < (std::numeric_limits<int64_t>::min() + d) / 10) return std::nullopt;
    v = v * 10 - d;
  }
  if (!negative) {
    if (v == std::numeric_limits<int64_t>::min()) return std::nullopt;
    v = -v;
  }
  return v;
}

std::string big_endian(int64_t v) {
  std::string out;
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>(static_cast<uint64_t>(v) >> shift));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  {  // string: valid UTF-8, used as is.
    auto r = decode_key(key_format::string, text, kDepth);
    FUZZ_CHECK(r.ok() == reference_utf8(text));
    if (r.ok()) FUZZ_CHECK(*r == text);
  }
  {  // base64url: the same bytes as the reference, and encoding them gives the text back.
    auto r = decode_key(key_format::base64url, text, kDepth);
    auto expected = reference_base64url(text);
    FUZZ_CHECK(r.ok() == expected.has_value());
    if (r.ok()) {
      FUZZ_CHECK(*r == *expected);
      std::string_view unpadded = text.substr(0, text.find('='));
      FUZZ_CHECK(kstate::query::base64url_encode(*r) == unpadded);
    }
    // Any bytes round-trip, and standard base64 is the same alphabet but two characters.
    const std::string enc = kstate::query::base64url_encode(text);
    auto back = kstate::query::base64url_decode(enc);
    FUZZ_CHECK(back.ok() && *back == text);
    std::string std_form = kstate::query::base64_encode(text);
    FUZZ_CHECK(std_form.size() % 4 == 0);
    for (auto& c : std_form) c = c == '+' ? '-' : c == '/' ? '_' : c;
    auto padded = reference_base64url(std_form);
    FUZZ_CHECK(padded && *padded == text);
  }
  {  // long: 8 bytes big-endian of the decimal value.
    auto r = decode_key(key_format::long_be, text, kDepth);
    auto expected = reference_long(text);
    FUZZ_CHECK(r.ok() == expected.has_value());
    if (r.ok()) FUZZ_CHECK(*r == big_endian(*expected));
  }
  {  // json: what nlohmann accepts, serialized compactly; the compact form is its own
     // canonical form and holds the same value. Documents nested deeper than the
     // bound are refused on purpose.
    auto r = decode_key(key_format::json, text, kDepth);
    const bool accepted = nlohmann::json::accept(text);
    FUZZ_CHECK(r.ok() == (accepted && fuzz_json_depth(text) <= kDepth));
    if (r.ok()) {
      auto again = decode_key(key_format::json, *r, kDepth);
      FUZZ_CHECK(again.ok() && *again == *r);
      FUZZ_CHECK(nlohmann::json::parse(*r) == nlohmann::json::parse(text));
    }
  }
  return 0;
}
