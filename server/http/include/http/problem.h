#pragma once
// Problem details for HTTP APIs (RFC 9457): the application/problem+json body every
// error answer of this library carries, and the errors the server answers by itself.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "http/message.h"

namespace kstate::http {

// A problem+json response: {"type", "title", "status", "detail", "instance"} plus the
// integer extension members given (e.g. an application's error code). `type` empty:
// "about:blank" (RFC 9457 section 4.2.1); `instance` empty: omitted. Text that is not
// valid UTF-8 (a decoded binary key quoted in `detail`) is rendered with U+FFFD in its
// place. Statuses 503 carry Retry-After: `retry_after_s`.
response problem(unsigned status, std::string_view type, std::string_view title, std::string_view detail,
                 std::string_view instance = {},
                 std::initializer_list<std::pair<std::string_view, int64_t>> int_members = {}, int retry_after_s = 1);

// Requests the server answers by itself, without calling the handler.
enum class server_error {
  bad_request,        // 400: the message cannot be framed (syntax, Transfer-Encoding, Content-Length)
  bad_target,         // 400: the request target is not valid (percent-encoding)
  payload_too_large,  // 413: body over server_config::max_body_bytes
  uri_too_long,       // 414: target over server_config::max_target_bytes
  headers_too_large,  // 431: header block (or chunk extensions and trailers) over max_header_bytes
  internal,           // 500: the handler threw, dropped its responder, or returned an invalid response
  overloaded,         // 503: server_config::max_connections connections are open
};

// Renders the server's own errors, so an application can answer them in its own error
// scheme (its error codes, its problem types). Called on I/O threads; must not block.
using error_renderer = std::function<response(server_error, std::string_view detail, std::string_view instance)>;

// The renderer used when the application sets none: a plain problem+json with the
// status's reason phrase as title.
response default_error(server_error e, std::string_view detail, std::string_view instance);

}  // namespace kstate::http
