#pragma once
// HTTP/1.1 syntax checks shared by the server (server.cc), the forwarding client
// (client.cc) and the request helpers (http.cc). Internal to the http library.

#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

namespace kstate::http::syntax {

// ASCII case-insensitive equality (header names).
inline bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](unsigned char x, unsigned char y) {
           return std::tolower(x) == std::tolower(y);
         });
}

// RFC 9110 tchar, as a table: header names are checked on every response.
inline constexpr auto tchar_table = [] {
  std::array<bool, 256> t{};
  for (int c = 0; c < 256; ++c)
    t[static_cast<std::size_t>(c)] =
        (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
  return t;
}();

// RFC 9110 token: what a header name (or method) must be made of.
inline bool is_token(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return tchar_table[c]; });
}

// A CR, LF or NUL in a header value would let a value that came from a client split
// the message it is written into.
inline bool valid_header_value(std::string_view v) {
  return std::none_of(v.begin(), v.end(), [](char c) { return c == '\r' || c == '\n' || c == '\0'; });
}

}  // namespace kstate::http::syntax
