#pragma once
// A model of compact JSON for the tests of check_json's compact layout and of the answer
// renderer: what nlohmann's accept() accepts, without whitespace outside strings, a
// byte order mark or a NUL byte (nlohmann reads a NUL as the end of the input).

#include <nlohmann/json.hpp>

#include <string_view>

namespace kstate::testing {

// True when `doc` has a space, tab, CR or LF outside its strings; the scan only tracks
// whether it is inside a string.
inline bool whitespace_outside_strings(std::string_view doc) {
  bool in_string = false;
  for (size_t i = 0; i < doc.size(); ++i) {
    const char c = doc[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      return true;
    }
  }
  return false;
}

inline bool compact_json_model(std::string_view doc) {
  if (!nlohmann::json::accept(doc.begin(), doc.end())) return false;
  if (doc.substr(0, 3) == "\xEF\xBB\xBF" || doc.find('\0') != std::string_view::npos) return false;
  return !whitespace_outside_strings(doc);
}

}  // namespace kstate::testing
