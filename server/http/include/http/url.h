#pragma once
// Splitting and percent-decoding request targets, and percent-encoding (Boost.URL does
// both).

#include <string>
#include <string_view>

#include "core/status.h"
#include "http/message.h"

namespace kstate::http {

// Parses an origin-form request target ("/a/b%2Fc?x=1&y=%00") into the path, its
// percent-decoded segments and the decoded query parameters of `req`. Segments may
// contain any byte after decoding, including '/' and NUL. Invalid percent-encoding
// ("%zz", a truncated "%4") is invalid_argument.
status parse_target(std::string_view target, request& req);

// Percent-encodes every byte but RFC 3986's unreserved characters (A-Z a-z 0-9 - . _ ~),
// so the result is safe as a path segment and as a query parameter's name or value.
std::string percent_encode(std::string_view s);

}  // namespace kstate::http
