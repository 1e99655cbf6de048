#pragma once
// kstate's one table that maps failure reasons to HTTP statuses and
// application/problem+json bodies (RFC 9457, rendered by http::problem) with an
// `error_code` extension: status * 100 + subcode, the scheme REST Proxy and ksqlDB
// users already know.

#include <string>
#include <string_view>

#include "http/message.h"
#include "http/problem.h"

namespace kstate::server {

enum class failure_reason {
  unknown_store,          // 404, 40401
  key_not_found,          // 404, 40402
  route_not_found,        // 404, 40403
  bad_request,            // 400, 40001  (generic malformed request, bad parameter)
  bad_key_encoding,       // 400, 40002  (percent-decoding, key_format decoding)
  bad_path_encoding,      // 400, 40003  (invalid percent-encoding in the path)
  bad_cursor,             // 400, 40004  (damaged cursor, or one made for another query)
  bad_limit,              // 400, 40005  (limit not a number in 1..max)
  bad_position,           // 400, 40006  (min_position not "partition:offset[,...]")
  unknown_parameter,      // 400, 40007  (a query parameter the route does not take)
  bad_body,               // 400, 40008  (request body is not the expected JSON)
  answer_too_large,       // 400, 40009  (the answer would exceed query.max_response_bytes)
  method_not_allowed,     // 405, 40501
  not_acceptable,         // 406, 40601
  payload_too_large,      // 413, 41301
  uri_too_long,           // 414, 41401
  unsupported_media,      // 415, 41501
  headers_too_large,      // 431, 43101
  internal,               // 500, 50001
  not_caught_up,          // 503, 50301  (partition assigned here but still restoring)
  not_owner,              // 503, 50302  (partition not assigned to this instance)
  shutting_down,          // 503, 50303
  position_not_reached,   // 503, 50304  (min_position not applied within timeout_ms)
  scan_capacity,          // 503, 50305  (too many streaming scans at once)
  too_many_connections,   // 503, 50306  (http.max_connections connections are open)
  too_many_waits,         // 503, 50307  (query.max_waiting_requests min_position waits at once)
  busy,                   // 503, 50308  (the API's worker queue is full)
  unauthenticated,        // 401, 40101  (no bearer token, or one the token file does not know)
  forbidden,              // 403, 40301  (a valid token without the scope the route needs)
  bad_peer,               // 401, 40102  (X-Kstate-Hop without a valid peer signature)
  history_gone,           // 410, 41001  (a change subscription's position is older than the topic holds)
  subscription_capacity,  // 503, 50309  (query.max_subscriptions change subscriptions are open)
  version_history_gone,   // 410, 41002  (as_of before the history a versioned store keeps)
};
// New reasons go last: tests walk the enumerators up to the last one.

struct failure_info {
  unsigned status;
  int error_code;
  std::string_view title;
};

// The table row for a reason.
failure_info describe(failure_reason r) noexcept;
// The reason's name (the last segment of its problem type, "/problems/<name>").
std::string_view name_of(failure_reason r) noexcept;

// A problem+json response for a reason. `detail` says what happened in this request;
// `instance` is the request path. Statuses 503 carry Retry-After (seconds).
http::response problem(failure_reason r, std::string_view detail, std::string_view instance = {},
                       int retry_after_s = 1);

// The HTTP server's own errors (a malformed message, a limit, the connection limit) in
// the same scheme: installed as http::server_config::render_error.
http::response render_server_error(http::server_error e, std::string_view detail, std::string_view instance);

}  // namespace kstate::server
