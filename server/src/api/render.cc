#include "api/render.h"

#include <charconv>

#include "core/window.h"
#include "server/json_render.h"

namespace kstate::server::api {

std::string position_header(const position& p) {
  std::string out;
  for (const auto& [part, off] : p) {
    if (!out.empty()) out += ',';
    append_int(out, part);
    out += ':';
    append_int(out, off);
  }
  return out;
}

void append_entry(std::string& out, const view_def& v, std::string_view key, std::string_view value, int32_t partition,
                  int64_t offset) {
  out += "{\"key\":";
  append_rendered_key(out, v.key_format, key);
  out += ",\"offset\":";
  append_int(out, offset);
  out += ",\"partition\":";
  append_int(out, partition);
  out += ",\"value\":";
  append_rendered_value(out, v.value_format, value);
  out += '}';
}

void append_window(std::string& out, const view_def& v, const std::string_view* key, int64_t start, int64_t end,
                   std::string_view value, int64_t offset, std::optional<int32_t> partition) {
  out += "{\"end\":";
  append_int(out, end);
  out += ",\"end_time\":";
  append_json_string(out, format_timestamp_ms(end));
  if (key) {
    out += ",\"key\":";
    append_rendered_key(out, v.key_format, *key);
  }
  out += ",\"offset\":";
  append_int(out, offset);
  if (partition) {
    out += ",\"partition\":";
    append_int(out, *partition);
  }
  out += ",\"start\":";
  append_int(out, start);
  out += ",\"start_time\":";
  append_json_string(out, format_timestamp_ms(start));
  out += ",\"value\":";
  // Aggregates are stored as JSON whatever the source's value format.
  append_rendered_value(out, data_format::json, value);
  out += '}';
}

std::string page_body(const std::vector<std::string_view>& entries, const std::optional<std::string>& next,
                      const position& pos, std::string_view served_by, bool stale) {
  std::size_t size = 64 + served_by.size() + 16 * pos.size() + (next ? next->size() : 0);
  for (auto e : entries) size += e.size() + 1;
  std::string out;
  out.reserve(size);
  out += "{\"data\":[";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i) out += ',';
    out += entries[i];
  }
  out += "],\"metadata\":{\"next\":";
  if (next) append_json_string(out, *next);
  else out += "null";
  out += ",\"position\":";
  append_position(out, pos);
  if (stale) out += ",\"stale\":true";
  out += "},\"served_by\":";
  append_json_string(out, served_by);
  out += '}';
  return out;
}

nlohmann::json problem_json(failure_reason r, std::string_view detail, std::string_view instance) {
  const auto info = describe(r);
  nlohmann::json body = {{"type", "/problems/" + std::string(name_of(r))},
                         {"title", info.title},
                         {"status", info.status},
                         {"detail", detail},
                         {"error_code", info.error_code}};
  if (!instance.empty()) body["instance"] = instance;
  return body;
}

http::response problem_response(failure_reason r, const nlohmann::json& body) {
  // Status and Retry-After as problem() sets them; the body rendered once.
  const auto info = describe(r);
  http::response res;
  res.status = info.status;
  res.content_type = "application/problem+json";
  res.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (info.status == 503) res.with_header("Retry-After", "1");
  return res;
}

nlohmann::json position_json(const position& p) {
  nlohmann::json o = nlohmann::json::object();
  for (const auto& [part, off] : p) o[std::to_string(part)] = off;
  return o;
}

http::response from_failure(query::failure_reason r, std::string_view message, std::string_view path) {
  switch (r) {
    case query::failure_reason::unknown_query_store: return problem(failure_reason::unknown_store, message, path);
    case query::failure_reason::not_active: return problem(failure_reason::not_owner, message, path);
    case query::failure_reason::not_up_to_date: return problem(failure_reason::not_caught_up, message, path);
    case query::failure_reason::history_unavailable:
      return problem(failure_reason::version_history_gone, message, path);
    case query::failure_reason::too_many_keys: return problem(failure_reason::answer_too_large, message, path);
    case query::failure_reason::store_exception: break;
  }
  // Storage failures are logged by the caller; the client sees what to quote.
  return problem(failure_reason::internal, message, path);
}

// --- part framing -------------------------------------------------------------------

namespace {

void append_item(std::string& out, std::string_view bytes) {
  append_int(out, static_cast<int64_t>(bytes.size()));
  out += ':';
  out.append(bytes.data(), bytes.size());
}

std::optional<std::string_view> next_item(std::string_view& in) {
  auto colon = in.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon > 12) return std::nullopt;
  std::size_t n = 0;
  auto [ptr, ec] = std::from_chars(in.data(), in.data() + colon, n);
  if (ec != std::errc() || ptr != in.data() + colon || in.size() - colon - 1 < n) return std::nullopt;
  auto item = in.substr(colon + 1, n);
  in.remove_prefix(colon + 1 + n);
  return item;
}

}  // namespace

part_writer::part_writer(const nlohmann::json& header) { append_item(out_, header.dump()); }

void part_writer::add(std::string_view stored_key, std::string_view entry_json) {
  append_item(out_, stored_key);
  append_item(out_, entry_json);
}

std::optional<part_view> read_part(std::string_view framed) {
  part_view out;
  auto header = next_item(framed);
  if (!header) return std::nullopt;
  out.header = nlohmann::json::parse(header->begin(), header->end(), nullptr, false);
  if (!out.header.is_object()) return std::nullopt;
  if (auto it = out.header.find("position"); it != out.header.end()) {
    if (!it->is_object()) return std::nullopt;
    for (const auto& [part, offset] : it->items()) {
      int32_t p = 0;
      const auto* end = part.data() + part.size();
      auto [ptr, ec] = std::from_chars(part.data(), end, p);
      if (ec != std::errc{} || ptr != end || p < 0 || !offset.is_number_integer()) return std::nullopt;
      out.pos.set(p, offset.get<int64_t>());
    }
  }
  while (!framed.empty()) {
    auto key = next_item(framed);
    if (!key) return std::nullopt;
    auto entry = next_item(framed);
    if (!entry) return std::nullopt;
    out.entries.push_back(part_entry{*key, *entry});
  }
  return out;
}

}  // namespace kstate::server::api
