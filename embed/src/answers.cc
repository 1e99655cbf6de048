#include "answers.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <map>

#include "query/key_format.h"

namespace kstate::embed::detail {
namespace {

// Member order kept: a json key is compared with the bytes producers wrote, which
// decode_key (query/key_format.h) keeps in their member order too.
using ordered = nlohmann::ordered_json;

error malformed(std::string_view what) {
  return error{error_code::internal,
               "the API's answer to " + std::string(what) + " is not what the route answers",
               {},
               {},
               500,
               50001};
}

// Standard base64 (how the API renders bytes values) read with the base64url decoder.
std::optional<std::string> base64_decode(std::string text) {
  for (auto& ch : text) {
    if (ch == '+') ch = '-';
    else if (ch == '/') ch = '_';
  }
  auto r = query::base64url_decode(text);
  if (!r.ok()) return std::nullopt;
  return std::move(r.value());
}

// A rendered key back to its serialized bytes (server/json_render.h: strings as JSON
// strings, json embedded, bytes as base64url).
std::optional<std::string> key_bytes(kstate::data_format f, const ordered& rendered) {
  switch (f) {
    case kstate::data_format::string:
      if (!rendered.is_string()) return std::nullopt;
      return rendered.get<std::string>();
    case kstate::data_format::bytes: {
      if (!rendered.is_string()) return std::nullopt;
      auto r = query::base64url_decode(rendered.get<std::string>());
      if (!r.ok()) return std::nullopt;
      return std::move(r.value());
    }
    case kstate::data_format::json: return rendered.dump(-1, ' ', false, ordered::error_handler_t::replace);
  }
  return std::nullopt;
}

// A rendered value back to bytes (bytes values are standard base64).
std::optional<std::string> value_bytes(kstate::data_format f, const ordered& rendered) {
  switch (f) {
    case kstate::data_format::string:
      if (!rendered.is_string()) return std::nullopt;
      return rendered.get<std::string>();
    case kstate::data_format::bytes:
      if (!rendered.is_string()) return std::nullopt;
      return base64_decode(rendered.get<std::string>());
    case kstate::data_format::json: return rendered.dump(-1, ' ', false, ordered::error_handler_t::replace);
  }
  return std::nullopt;
}

std::optional<position> position_of(const ordered& j) {
  if (!j.is_object()) return std::nullopt;
  position out;
  for (const auto& [k, v] : j.items()) {
    int32_t p = 0;
    auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), p);
    if (ec != std::errc() || end != k.data() + k.size() || !v.is_number_integer()) return std::nullopt;
    out[p] = v.get<int64_t>();
  }
  return out;
}

std::optional<ordered> body_of(const http::response& r) {
  auto j = ordered::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

template <typename T>
std::optional<T> member(const ordered& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return std::nullopt;
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return std::nullopt;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return std::nullopt;
  } else {
    if (!it->is_number_integer()) return std::nullopt;
  }
  return it->template get<T>();
}

// {"key","offset","partition","value"} of a range or batch.
std::optional<std::pair<std::string, entry>> entry_of(const view_def& v, const ordered& e) {
  if (!e.is_object() || !e.contains("key") || !e.contains("value")) return std::nullopt;
  auto key = key_bytes(v.key_format, e["key"]);
  auto value = value_bytes(v.value_format, e["value"]);
  auto offset = member<int64_t>(e, "offset");
  auto partition = member<int32_t>(e, "partition");
  if (!key || !value || !offset || !partition) return std::nullopt;
  entry out{*key, std::move(*value), *partition, *offset};
  return std::pair{std::move(*key), std::move(out)};
}

}  // namespace

error error_of(const http::response& r) {
  error e;
  e.http_status = static_cast<int>(r.status);
  std::string detail;
  if (auto j = body_of(r)) {
    e.rest_error_code = member<int>(*j, "error_code").value_or(0);
    detail = member<std::string>(*j, "detail").value_or("");
  }
  for (const auto& [name, value] : r.headers) {
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    int s = 0;
    if (lower == "retry-after" && std::from_chars(value.data(), value.data() + value.size(), s).ec == std::errc())
      e.retry_after = std::chrono::seconds(s);
  }
  switch (e.rest_error_code) {
    case 40401: e.code = error_code::not_found; break;
    case 40009: e.code = error_code::resource_exhausted; break;
    case 50304: e.code = error_code::deadline_exceeded; break;
    case 50305:
    case 50307: e.code = error_code::resource_exhausted; break;
    default:
      if (r.status >= 400 && r.status < 500) e.code = error_code::invalid_argument;
      else if (r.status == 503) e.code = error_code::unavailable;
      else e.code = error_code::internal;
  }
  e.message = detail.empty() ? "HTTP status " + std::to_string(r.status) : detail;
  return e;
}

result<key_result> read_key_answer(const view_def& v, const http::response& r) {
  auto j = body_of(r);
  if (r.status == 404 && j && member<int>(*j, "error_code") == 40402) {
    // Absent as of the position the answer names.
    key_result out;
    auto pos = j->contains("position") ? position_of((*j)["position"]) : std::nullopt;
    auto partition = member<int32_t>(*j, "partition");
    if (!pos || !partition) return malformed("a key lookup");
    out.partition = *partition;
    out.pos = std::move(*pos);
    out.served_by = member<std::string>(*j, "served_by").value_or("");
    return out;
  }
  if (r.status != 200) return error_of(r);
  if (!j || !j->contains("value") || !j->contains("position")) return malformed("a key lookup");
  auto value = value_bytes(v.value_format, (*j)["value"]);
  auto pos = position_of((*j)["position"]);
  auto partition = member<int32_t>(*j, "partition");
  auto offset = member<int64_t>(*j, "offset");
  if (!value || !pos || !partition || !offset) return malformed("a key lookup");
  key_result out;
  out.value = std::move(*value);
  out.partition = *partition;
  out.offset = *offset;
  out.pos = std::move(*pos);
  out.served_by = member<std::string>(*j, "served_by").value_or("");
  out.valid_from = member<int64_t>(*j, "valid_from");
  out.valid_to = member<int64_t>(*j, "valid_to");
  return out;
}

result<multi_result> read_batch_answer(const view_def& v, const std::vector<std::string>& keys,
                                       const http::response& r) {
  if (r.status != 200) return error_of(r);
  auto j = body_of(r);
  if (!j || !j->contains("data") || !(*j)["data"].is_array() || !j->contains("metadata"))
    return malformed("a batch lookup");
  const auto& meta = (*j)["metadata"];
  auto pos = meta.is_object() && meta.contains("position") ? position_of(meta["position"]) : std::nullopt;
  if (!pos) return malformed("a batch lookup");
  std::map<std::string, entry> found;
  for (const auto& e : (*j)["data"]) {
    auto parsed = entry_of(v, e);
    if (!parsed) return malformed("a batch lookup");
    found.insert(std::move(*parsed));
  }
  multi_result out;
  out.keys.reserve(keys.size());
  const std::string served_by = member<std::string>(*j, "served_by").value_or("");
  for (const auto& k : keys) {
    key_result kr;
    kr.served_by = served_by;
    if (auto it = found.find(k); it != found.end()) {
      kr.value = it->second.value;
      kr.partition = it->second.partition;
      kr.offset = it->second.offset;
    }
    out.keys.push_back(std::move(kr));
  }
  out.pos = std::move(*pos);
  return out;
}

result<range_page> read_range_answer(const view_def& v, const http::response& r) {
  if (r.status != 200) return error_of(r);
  auto j = body_of(r);
  if (!j || !j->contains("data") || !(*j)["data"].is_array() || !j->contains("metadata")) return malformed("a range");
  const auto& meta = (*j)["metadata"];
  auto pos = meta.is_object() && meta.contains("position") ? position_of(meta["position"]) : std::nullopt;
  if (!pos) return malformed("a range");
  range_page out;
  for (const auto& e : (*j)["data"]) {
    auto parsed = entry_of(v, e);
    if (!parsed) return malformed("a range");
    out.entries.push_back(std::move(parsed->second));
  }
  if (meta.contains("next") && meta["next"].is_string()) out.next = meta["next"].get<std::string>();
  out.pos = std::move(*pos);
  return out;
}

result<count_result> read_count_answer(const http::response& r) {
  if (r.status != 200) return error_of(r);
  auto j = body_of(r);
  if (!j) return malformed("a count");
  auto count = member<uint64_t>(*j, "count");
  auto exact = member<bool>(*j, "exact");
  auto meta = j->find("metadata");
  std::optional<position> pos;
  if (meta != j->end() && meta->is_object() && meta->contains("position")) pos = position_of((*meta)["position"]);
  if (!count || !exact || !pos) return malformed("a count");
  return count_result{*count, *exact, std::move(*pos)};
}

namespace {

// One rendered window ({"start","end","value","offset",...}).
std::optional<window_value> window_of(const ordered& w) {
  if (!w.is_object() || !w.contains("value")) return std::nullopt;
  auto start = member<int64_t>(w, "start");
  auto end = member<int64_t>(w, "end");
  auto offset = member<int64_t>(w, "offset");
  if (!start || !end || !offset) return std::nullopt;
  return window_value{*start, *end, w["value"].dump(-1, ' ', false, ordered::error_handler_t::replace), *offset};
}

}  // namespace

result<windows_result> read_windows_answer(const http::response& r) {
  if (r.status != 200) return error_of(r);
  auto j = body_of(r);
  if (!j || !j->contains("data") || !(*j)["data"].is_array() || !j->contains("position"))
    return malformed("a key's windows");
  auto pos = position_of((*j)["position"]);
  auto partition = member<int32_t>(*j, "partition");
  if (!pos || !partition) return malformed("a key's windows");
  windows_result out;
  for (const auto& w : (*j)["data"]) {
    auto win = window_of(w);
    if (!win) return malformed("a key's windows");
    out.windows.push_back(std::move(*win));
  }
  out.partition = *partition;
  out.pos = std::move(*pos);
  return out;
}

result<windows_page> read_windows_range_answer(const view_def& v, const http::response& r) {
  if (r.status != 200) return error_of(r);
  auto j = body_of(r);
  if (!j || !j->contains("data") || !(*j)["data"].is_array() || !j->contains("metadata"))
    return malformed("a page of windows");
  const auto& meta = (*j)["metadata"];
  auto pos = meta.is_object() && meta.contains("position") ? position_of(meta["position"]) : std::nullopt;
  if (!pos) return malformed("a page of windows");
  windows_page out;
  for (const auto& w : (*j)["data"]) {
    auto win = window_of(w);
    auto key = w.is_object() && w.contains("key") ? key_bytes(v.key_format, w["key"]) : std::nullopt;
    auto partition = member<int32_t>(w, "partition");
    if (!win || !key || !partition) return malformed("a page of windows");
    out.entries.push_back({std::move(*key), std::move(*win), *partition});
  }
  if (meta.contains("next") && meta["next"].is_string()) out.next = meta["next"].get<std::string>();
  out.pos = std::move(*pos);
  return out;
}

}  // namespace kstate::embed::detail
