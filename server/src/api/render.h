#pragma once
// The bytes of the API's answers, written straight into the response body without a
// DOM. Each function writes exactly what nlohmann::json::dump() (members sorted by
// name, error_handler_t::replace) would print for the same content, so answers keep
// their bytes whichever way they were produced (tests/server compare the two).
//
// Also the internal part framing: how one owner's part of a range, batch or count
// travels to the instance that merges the parts, without being parsed and rendered
// again there.
//
// Thread safety: pure functions.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/types.h"
#include "core/view.h"
#include "http/message.h"
#include "query/engine.h"
#include "server/problem.h"

namespace kstate::server::api {

// "0:12,3:40": a position as the X-Kstate-Position header carries it.
std::string position_header(const position& p);

// {"key":..,"offset":..,"partition":..,"value":..}: one stored entry.
void append_entry(std::string& out, const view_def& v, std::string_view key, std::string_view value, int32_t partition,
                  int64_t offset);

// One window of a windowed store: {"end","end_time",["key"],"offset",["partition"],
// "start","start_time","value"}; `key` and `partition` only in lists across keys.
void append_window(std::string& out, const view_def& v, const std::string_view* key, int64_t start, int64_t end,
                   std::string_view value, int64_t offset, std::optional<int32_t> partition);

// {"data":[<entries>],"metadata":{"next":<cursor>|null,"position":{..}},"served_by":..}
// from entries already rendered (each a JSON object); with `stale`, the metadata says
// "stale":true (some partition was read from a copy).
std::string page_body(const std::vector<std::string_view>& entries, const std::optional<std::string>& next,
                      const position& pos, std::string_view served_by, bool stale = false);

// A problem body as a DOM, so an answer can add members (partition, position, ...)
// before it is printed once.
nlohmann::json problem_json(failure_reason r, std::string_view detail, std::string_view instance);
// A response from a problem DOM (status, content type and Retry-After from the table).
http::response problem_response(failure_reason r, const nlohmann::json& body);

// {"<partition>":offset,...} as a DOM member value.
nlohmann::json position_json(const position& p);

// The answer to a failed query (unknown store 404, not held 503, not caught up 503,
// storage failure 500).
http::response from_failure(query::failure_reason r, std::string_view message, std::string_view path);

// --- internal part framing (peer to peer only) -------------------------------------
//
// Media type application/x-kstate-part. A part is a header (a JSON object: "more",
// "position", and for counts "count" and "exact") followed by entries, each a stored
// key and its rendered JSON, every item length-prefixed: "<decimal length>:<bytes>".
// Binary-safe, and the merging instance copies entry bytes without parsing them.
inline constexpr std::string_view part_media_type = "application/x-kstate-part";

class part_writer {
 public:
  explicit part_writer(const nlohmann::json& header);
  void add(std::string_view stored_key, std::string_view entry_json);
  // The framed bytes; the writer is empty afterwards.
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

struct part_entry {
  std::string_view stored_key;
  std::string_view entry_json;
};
struct part_view {
  nlohmann::json header;
  position pos;                     // the header's "position", decoded once
  std::vector<part_entry> entries;  // views into the framed bytes
};
// nullopt when `framed` is not a well-formed part (a "position" that is not an object
// of decimal partitions to integer offsets included).
std::optional<part_view> read_part(std::string_view framed);

}  // namespace kstate::server::api
