#include "core/view.h"

namespace kstate {

const char* to_string(data_format f) noexcept {
  switch (f) {
    case data_format::string: return "string";
    case data_format::json: return "json";
    case data_format::bytes: return "bytes";
  }
  return "unknown";
}

const char* to_string(view_kind k) noexcept {
  switch (k) {
    case view_kind::table: return "table";
  }
  return "unknown";
}

bool parse_data_format(std::string_view s, data_format& out) noexcept {
  if (s == "string") out = data_format::string;
  else if (s == "json") out = data_format::json;
  else if (s == "bytes") out = data_format::bytes;
  else return false;
  return true;
}

}  // namespace kstate
