#pragma once
// check_json(): the one JSON validity and nesting-depth check of kstate, run before
// nlohmann parses anything a record or a client controls.
//
// nlohmann's parser is iterative, but dump() and copying a value recurse once per
// nesting level, so a document nested 100,000 deep overflows the stack wherever it is
// printed. Every JSON input is therefore bounded in depth first: record keys and values
// at ingest (invalid record beyond the limit), what aggregates parse, keys given with
// key_format=json, and request bodies.

#include <string_view>

namespace kstate {

// The default of the configuration key `max_json_depth`, and its allowed range.
inline constexpr int default_max_json_depth = 128;
inline constexpr int min_max_json_depth = 1;
inline constexpr int max_max_json_depth = 10'000;

enum class json_verdict {
  ok,        // one JSON document, nested at most max_depth deep
  invalid,   // not JSON (what nlohmann::json::accept() refuses)
  too_deep,  // an array or object opens deeper than max_depth
};

// What may surround and separate the tokens of a document.
enum class json_layout {
  // Whitespace between tokens, a leading UTF-8 byte order mark, and anything after a NUL
  // byte that follows the document: what nlohmann accepts.
  any,
  // None of these: the text is the document's tokens and nothing else, as producers
  // write JSON and as kstate renders it (whitespace inside strings is part of a token).
  compact,
};

// Checks `text` in one pass over its bytes, without recursion; it keeps one byte per
// open container, so at most max_depth bytes, whatever the input.
//
// Valid means exactly what nlohmann::json::accept() accepts, since that is what kstate
// parses with afterwards: RFC 8259 with an optional leading UTF-8 byte order mark,
// strings of valid UTF-8 with paired surrogate escapes, numbers that parse to a finite
// double when they are not 64-bit integers, and nothing looked at after a NUL byte
// that follows a complete document.
//
// Depth is the number of arrays and objects around the innermost value: a scalar is 0
// deep, `[]` and `{"a":1}` are 1 deep, `[[1]]` and `{"a":[]}` are 2 deep. too_deep is
// answered as soon as a container opens past max_depth, whatever follows it, so the
// cost of refusing a deep document does not depend on its length.
//
// With json_layout::compact, a text that is valid with json_layout::any but has
// whitespace outside strings, a byte order mark or bytes after the document is invalid.
//
// Thread safety: a pure function.
json_verdict check_json(std::string_view text, int max_depth, json_layout layout = json_layout::any);

}  // namespace kstate
