// The header syntax checks every response goes through, byte by byte against the
// grammar's own wording (RFC 9110 5.6.2 tchar; CR, LF and NUL end a field value).
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "syntax.h"

using namespace kstate::http::syntax;

namespace {

// tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" /
//         "`" / "|" / "~" / DIGIT / ALPHA
const std::string_view tchars = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

}  // namespace

TEST_CASE("syntax: a token is made of tchars only, every byte checked") {
  CHECK_FALSE(is_token(""));
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const bool tchar = tchars.find(c) != std::string_view::npos;
    CAPTURE(b);
    CHECK(is_token(std::string(1, c)) == tchar);
    CHECK(is_token("X-" + std::string(1, c) + "-Name") == tchar);
  }
  CHECK(is_token("X-Kstate-Position"));
  CHECK_FALSE(is_token("Bad Name"));
}

TEST_CASE("syntax: a header value may hold any byte but CR, LF and NUL") {
  CHECK(valid_header_value(""));
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const bool allowed = c != '\r' && c != '\n' && c != '\0';
    CAPTURE(b);
    CHECK(valid_header_value(std::string("a") + c + "b") == allowed);
  }
  CHECK_FALSE(valid_header_value(std::string("a\0b", 3)));
  CHECK_FALSE(valid_header_value("a\r\nSet-Cookie: x=1"));
}
