#pragma once
// How a client writes a key in a URL or request body, and how it becomes the serialized
// key bytes that producers wrote (and that partitioning and ordering use).
//
//   string     UTF-8 text, used as is (the default)
//   base64url  any bytes, base64url (RFC 4648 section 5), padding optional
//   long       a signed 64-bit decimal, serialized 8-byte big-endian as Kafka's LongSerializer
//   json       a JSON value, serialized compactly (no whitespace, member order kept),
//              as JSON serializers such as Jackson's write it

#include <string>
#include <string_view>

#include "core/status.h"

namespace kstate::query {

enum class key_format { string, base64url, long_be, json };

bool parse_key_format(std::string_view name, key_format& out) noexcept;
const char* to_string(key_format f) noexcept;

// invalid_argument naming the problem (bad UTF-8, bad base64url, out-of-range long,
// JSON that is not valid or is nested deeper than `max_json_depth`: it is checked with
// check_json (core/json_check.h) before it is parsed and re-serialized, which recurse
// per level).
result<std::string> decode_key(key_format f, std::string_view text, int max_json_depth);

// Standard base64 with padding (how byte values appear in JSON answers).
std::string base64_encode(std::string_view bytes);
// base64url without padding (cursors, keys of bytes stores).
std::string base64url_encode(std::string_view bytes);
// Accepts base64url with or without padding; rejects anything else.
result<std::string> base64url_decode(std::string_view text);

}  // namespace kstate::query
