#pragma once
// Writing JSON answers straight into a string, without building a DOM.
//
// The point-lookup path renders one small object per request; building an
// nlohmann::json tree for it (and parsing the stored value into one, only to print it
// again) was most of the per-request work. These functions append bytes identical to
// what `nlohmann::json::dump(-1, ' ', false, error_handler_t::replace)` writes for the
// same content, so answers do not change. Where the fast form cannot promise that (a
// stored value that is not already in dump()'s canonical form, text that is not valid
// UTF-8) they fall back to nlohmann itself.
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

// Appends `doc` unchanged and returns true when dump(parse(doc)) == doc, i.e. the
// document is already compact, objects have strictly increasing keys (dump() sorts
// them), strings use only the escapes dump() writes, and numbers are integers that
// print back the same. Otherwise appends nothing and returns false.
bool append_canonical_json(std::string& out, std::string_view doc);

// A stored key or value as the API renders it: JSON embedded as JSON (printed as
// dump() prints it), strings as JSON strings, bytes as base64 (values) or base64url
// (keys) strings.
void append_rendered_value(std::string& out, data_format f, std::string_view bytes);
void append_rendered_key(std::string& out, data_format f, std::string_view bytes);

// {"<partition>":offset,...} with the partitions in the order dump() prints object
// keys (as strings: "10" before "2").
void append_position(std::string& out, const position& p);

// Decimal integer.
void append_int(std::string& out, int64_t v);

}  // namespace kstate::server
