#pragma once
// The field at a dotted path of a parsed JSON value (internal to ingest): group keys,
// aggregated numbers, join projections and foreign keys all name fields this way.

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace kstate::ingest {

// The field at `path` ("a.b.c": member a, then its member b, ...) of `doc`, or null
// when a step is missing or not an object. Segments are not unescaped: a member whose
// name holds a '.' cannot be named.
inline const nlohmann::json* json_at_path(const nlohmann::json& doc, std::string_view path) {
  const nlohmann::json* cur = &doc;
  size_t start = 0;
  for (;;) {
    const auto dot = path.find('.', start);
    const auto seg = path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(std::string(seg));
    if (it == cur->end()) return nullptr;
    cur = &*it;
    if (dot == std::string_view::npos) return cur;
    start = dot + 1;
  }
}

}  // namespace kstate::ingest
