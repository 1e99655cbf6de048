#pragma once
// Parsing a request's parameters, each into a value or the 4xx answer that says what
// is wrong with it.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "api/state.h"
#include "core/view.h"
#include "query/key_format.h"

namespace kstate::server::api {

// A parsed parameter, or the answer refusing the request.
template <typename T>
class [[nodiscard]] param {
 public:
  param(T v) : v_(std::in_place_index<0>, std::move(v)) {}                   // NOLINT: implicit by design
  param(http::response err) : v_(std::in_place_index<1>, std::move(err)) {}  // NOLINT
  bool ok() const noexcept { return v_.index() == 0; }
  T& operator*() { return std::get<0>(v_); }
  const T& operator*() const { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  http::response error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, http::response> v_;
};

// The store the path names (404 when there is none).
param<const view_def*> store_of(const state& st, const call& c);
// The request's key_format, else the store's default.
param<query::key_format> key_format_of(const call& c, const view_def& v);
// Key text in a format as serialized key bytes; `what` names the parameter in the error
// ("from", "keys[3]"; empty for the path's key).
param<std::string> decode_key(const state& st, const call& c, query::key_format f, std::string_view text,
                              std::string_view what = {});
// The same for element `index` of a list named `list` ("keys[3]" in the error).
param<std::string> decode_key(const state& st, const call& c, query::key_format f, std::string_view text,
                              const char* list, std::size_t index);
// `limit`: default_limit when absent, 1..max_limit.
param<uint32_t> limit_of(const state& st, const call& c);
// `order`: asc (default) or desc; true for desc.
param<bool> descending_of(const call& c);
// [from, to) of a window query, ms: epoch ms or RFC 3339; from defaults to the epoch,
// to to unbounded.
param<std::pair<int64_t, int64_t>> interval_of(const call& c);
// `as_of` (epoch ms or RFC 3339): nullopt when absent; on a store that is not versioned,
// a 400 naming the `versioned` setting.
param<std::optional<int64_t>> as_of_of(const call& c, const view_def& v);

// min_position ("p:o[,p:o...]", or the X-Kstate-Min-Position header) and timeout_ms:
// nullopt when not given. A partition at or beyond `partition_count` (the store's
// topic's; 0 when not known, then unchecked) can never be reached and is refused.
struct wait_bound {
  position bound;
  std::chrono::milliseconds timeout;
};
param<std::optional<wait_bound>> min_position_of(const state& st, const http::request& req, int32_t partition_count);

// "p:o[,p:o...]" as a position; nullopt when malformed. A partition named twice keeps
// its larger offset.
std::optional<position> parse_position(std::string_view s);

// `partitions` (a peer's part of a gather): distinct partitions of the topic, in the
// order given; nullopt when absent.
param<std::optional<std::vector<int32_t>>> partitions_of(const call& c, int32_t partition_count);
// `after` (a peer's part: resume strictly after this stored key, base64url).
param<std::optional<std::string>> after_of(const call& c);

// What the client accepts: JSON (also for */*, application/*, none given), NDJSON when
// the route streams, the part framing only from peers.
enum class media { json, ndjson, part, none };
media negotiate(const call& c, bool ndjson_ok);
// Appends a length-prefixed field to a cursor fingerprint, so distinct queries never
// share one.
void fingerprint_add(std::string& fp, const std::optional<std::string>& v);
// What a cursor of a page of keys is made for: the store, the order and the bounds.
std::string keys_fingerprint(std::string_view store, bool descending, const std::optional<std::string>& from,
                             const std::optional<std::string>& to, const std::optional<std::string>& prefix);

// "0,3,5".
std::string partition_list(const std::vector<int32_t>& parts);

}  // namespace kstate::server::api
