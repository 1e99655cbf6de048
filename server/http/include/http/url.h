#pragma once
// Splitting and percent-decoding request targets (Boost.URL does the decoding).

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

}  // namespace kstate::http
