#pragma once
#include <string_view>

namespace kstate {

// True when `s` is well-formed UTF-8 (RFC 3629): no overlong forms, no surrogates,
// nothing above U+10FFFF. NUL bytes are allowed.
bool valid_utf8(std::string_view s) noexcept;

}  // namespace kstate
