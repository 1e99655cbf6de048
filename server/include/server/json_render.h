#pragma once
// Writing JSON answers straight into a string, without building a DOM.
//
// The point-lookup path renders one small object per request; building an
// nlohmann::json tree for it (and parsing the stored value into one, only to print it
// again) was most of the per-request work. Strings are escaped as
// `nlohmann::json::dump(-1, ' ', false, error_handler_t::replace)` escapes them. A
// stored JSON key or value is embedded as it was stored when it is compact (no
// whitespace outside strings, valid UTF-8), which is how producers write JSON and how
// kstate stores JSON keys: member order, duplicate members, escapes and the digits of
// numbers stay as written, so a rendered key is the key itself. Any other document
// (whitespace, invalid UTF-8) is parsed and printed compactly by nlohmann, member order
// kept.
//
// Thread safety: pure functions.

#include <cstdint>
#include <string>
#include <string_view>

#include "core/types.h"
#include "core/view.h"

namespace kstate::server {

// A JSON string: `s` quoted and escaped as dump() escapes it.
void append_json_string(std::string& out, std::string_view s);

// Appends `doc` unchanged and returns true when check_json() finds it valid and compact
// (core/json_check.h), nested at most max_max_json_depth deep. Otherwise appends nothing
// and returns false.
bool append_compact_json(std::string& out, std::string_view doc);

// A stored key or value as the API renders it: JSON embedded as JSON (as stored when
// compact, see above), strings as JSON strings, bytes as base64 (values) or base64url
// (keys) strings.
void append_rendered_value(std::string& out, data_format f, std::string_view bytes);
void append_rendered_key(std::string& out, data_format f, std::string_view bytes);

// {"<partition>":offset,...} with the partitions in the order dump() prints object
// keys (as strings: "10" before "2").
void append_position(std::string& out, const position& p);

// Decimal integer.
void append_int(std::string& out, int64_t v);

}  // namespace kstate::server
