#pragma once
// Range cursors: opaque to clients, checked by kstate.
//
// A cursor says "resume strictly after this key" for one query (store, bounds, order).
// Keys are unique across partitions and ranges are ordered by key bytes, so resuming
// after the last key returned yields every key exactly once and in order, even while
// ingest writes and even across instances and rebalances. The token is base64url of a
// versioned payload with an XXH64 checksum that covers the query's fingerprint, so a
// damaged cursor, or one used with another query, is rejected.

#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kstate::query {

struct cursor {
  std::string last_key;  // serialized bytes of the last key returned
};

// `fingerprint`: anything that identifies the query (store, bounds, order).
std::string encode_cursor(const cursor& c, std::string_view fingerprint);
// invalid_argument when damaged, truncated or made for another query.
result<cursor> decode_cursor(std::string_view token, std::string_view fingerprint);

}  // namespace kstate::query
