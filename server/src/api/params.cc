#include "api/params.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <set>

#include "api/render.h"
#include "core/window.h"
#include "server/problem.h"

namespace kstate::server::api {
namespace {

std::optional<int64_t> parse_int(std::string_view s) {
  int64_t v;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

}  // namespace

std::optional<position> parse_position(std::string_view s) {
  position out;
  if (s.empty()) return std::nullopt;
  while (!s.empty()) {
    auto comma = s.find(',');
    auto item = s.substr(0, comma);
    auto colon = item.find(':');
    if (colon == std::string_view::npos) return std::nullopt;
    auto p = parse_int(item.substr(0, colon));
    auto o = parse_int(item.substr(colon + 1));
    if (!p || !o || *p < 0 || *p > std::numeric_limits<int32_t>::max() || *o < 0) return std::nullopt;
    out.merge(position{{static_cast<int32_t>(*p), *o}});
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
    if (s.empty()) return std::nullopt;
  }
  return out;
}

param<const view_def*> store_of(const state& st, const call& c) {
  const auto* v = st.ctx.queries->find_store(c.store);
  if (!v) return problem(failure_reason::unknown_store, "no store named '" + c.store + "'", c.path());
  return v;
}

param<query::key_format> key_format_of(const call& c, const view_def& v) {
  auto name = c.r().param("key_format");
  if (!name) {
    switch (v.key_format) {
      case data_format::json: return query::key_format::json;
      case data_format::bytes: return query::key_format::base64url;
      case data_format::string: return query::key_format::string;
    }
    return query::key_format::string;
  }
  query::key_format f;
  if (!query::parse_key_format(*name, f))
    return problem(failure_reason::bad_request,
                   "key_format must be one of: string, base64url, long, json (got '" + name->substr(0, 64) + "')",
                   c.path());
  return f;
}

namespace {

http::response bad_key(const call& c, std::string_view what, const status& why) {
  std::string detail = what.empty() ? why.message() : std::string(what) + ": " + why.message();
  return problem(failure_reason::bad_key_encoding, detail, c.path());
}

}  // namespace

param<std::string> decode_key(const state& st, const call& c, query::key_format f, std::string_view text,
                              std::string_view what) {
  auto k = query::decode_key(f, text, st.ctx.limits.max_json_depth);
  if (!k.ok()) return bad_key(c, what, k.error());
  return std::move(*k);
}

param<std::string> decode_key(const state& st, const call& c, query::key_format f, std::string_view text,
                              const char* list, std::size_t index) {
  auto k = query::decode_key(f, text, st.ctx.limits.max_json_depth);
  // The element's name is made only for the problem.
  if (!k.ok()) return bad_key(c, std::string(list) + "[" + std::to_string(index) + "]", k.error());
  return std::move(*k);
}

param<uint32_t> limit_of(const state& st, const call& c) {
  auto l = c.r().param("limit");
  if (!l) return st.ctx.limits.default_limit;
  auto v = parse_int(*l);
  if (!v || *v < 1 || *v > st.ctx.limits.max_limit)
    return problem(failure_reason::bad_limit, "limit must be 1.." + std::to_string(st.ctx.limits.max_limit), c.path());
  return static_cast<uint32_t>(*v);
}

param<bool> descending_of(const call& c) {
  auto order = c.r().param("order").value_or("asc");
  if (order != "asc" && order != "desc")
    return problem(failure_reason::bad_request, "order must be asc or desc (got '" + order.substr(0, 64) + "')",
                   c.path());
  return order == "desc";
}

param<std::pair<int64_t, int64_t>> interval_of(const call& c) {
  std::pair<int64_t, int64_t> out{0, std::numeric_limits<int64_t>::max()};
  for (auto [name, field] : {std::pair{"from", &out.first}, std::pair{"to", &out.second}}) {
    auto text = c.r().param(name);
    if (!text) continue;
    auto t = parse_timestamp_ms(*text);
    if (!t.ok()) return problem(failure_reason::bad_request, std::string(name) + ": " + t.error().message(), c.path());
    *field = t.value();
  }
  if (out.first >= out.second) return problem(failure_reason::bad_request, "from must be before to", c.path());
  return out;
}

param<std::optional<int64_t>> as_of_of(const call& c, const view_def& v) {
  auto text = c.r().param("as_of");
  if (!text) return std::optional<int64_t>();
  if (!v.versioned)
    return problem(failure_reason::bad_request,
                   "as_of: store '" + v.name +
                       "' keeps only the latest value of each key; set versioned: {history: ...} on the view to read "
                       "earlier ones",
                   c.path());
  auto t = parse_timestamp_ms(*text);
  if (!t.ok()) return problem(failure_reason::bad_request, "as_of: " + t.error().message(), c.path());
  return std::optional<int64_t>(t.value());
}

param<std::optional<wait_bound>> min_position_of(const state& st, const http::request& req, int32_t partition_count) {
  auto text = req.param("min_position");
  if (!text) text = req.header("x-kstate-min-position");
  if (!text) return std::optional<wait_bound>();
  auto bound = parse_position(*text);
  if (!bound)
    return problem(failure_reason::bad_position,
                   "min_position must be partition:offset pairs separated by commas, e.g. 0:42,3:7", req.path);
  // Never silently ignored: a lookup reads one partition and would pass over a pair
  // naming another, but a partition the topic does not have is the caller's mistake
  // (another topic's offsets), and read-your-writes would quietly not hold.
  if (partition_count > 0)
    for (const auto& [p, o] : *bound)
      if (p >= partition_count)
        return problem(failure_reason::bad_position,
                       "min_position names partition " + std::to_string(p) + "; the store's topic has partitions 0.." +
                           std::to_string(partition_count - 1),
                       req.path);
  auto wait = st.ctx.limits.default_wait;
  if (auto t = req.param("timeout_ms")) {
    auto v = parse_int(*t);
    if (!v || *v < 0 || *v > st.ctx.limits.max_wait.count())
      return problem(failure_reason::bad_request,
                     "timeout_ms must be 0.." + std::to_string(st.ctx.limits.max_wait.count()), req.path);
    wait = std::chrono::milliseconds(*v);
  }
  return std::optional<wait_bound>(wait_bound{std::move(*bound), wait});
}

param<std::optional<std::vector<int32_t>>> partitions_of(const call& c, int32_t partition_count) {
  auto list = c.r().param("partitions");
  if (!list) return std::optional<std::vector<int32_t>>();
  std::vector<int32_t> out;
  std::set<int32_t> seen;
  std::string_view s = *list;
  while (true) {
    auto comma = s.find(',');
    auto v = parse_int(s.substr(0, comma));
    if (!v || *v < 0 || *v >= partition_count || !seen.insert(static_cast<int32_t>(*v)).second)
      return problem(
          failure_reason::bad_request,
          "partitions must list distinct partitions of the topic (0.." + std::to_string(partition_count - 1) + ")",
          c.path());
    out.push_back(static_cast<int32_t>(*v));
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return std::optional<std::vector<int32_t>>(std::move(out));
}

param<std::optional<std::string>> after_of(const call& c) {
  auto after = c.r().param("after");
  if (!after) return std::optional<std::string>();
  auto raw = query::base64url_decode(*after);
  if (!raw.ok()) return problem(failure_reason::bad_cursor, "after: " + raw.error().message(), c.path());
  return std::optional<std::string>(std::move(*raw));
}

media negotiate(const call& c, bool ndjson_ok) {
  auto accept = c.r().header("accept");
  if (!accept || accept->empty()) return media::json;
  const auto& a = *accept;
  if (c.from_peer && a.find(part_media_type) != std::string::npos) return media::part;
  if (ndjson_ok && a.find("application/x-ndjson") != std::string::npos) return media::ndjson;
  if (a.find("application/json") != std::string::npos || a.find("*/*") != std::string::npos ||
      a.find("application/*") != std::string::npos || a.find("application/problem+json") != std::string::npos)
    return media::json;
  return media::none;
}

void fingerprint_add(std::string& fp, const std::optional<std::string>& v) {
  if (!v) {
    fp += '-';
    return;
  }
  fp += std::to_string(v->size()) + ':' + *v;
}

std::string keys_fingerprint(std::string_view store, bool descending, const std::optional<std::string>& from,
                             const std::optional<std::string>& to, const std::optional<std::string>& prefix) {
  std::string fp(store);
  fp += '\0';
  fp += descending ? "desc" : "asc";
  fp += '\0';
  fingerprint_add(fp, from);
  fingerprint_add(fp, to);
  fingerprint_add(fp, prefix);
  return fp;
}

std::string partition_list(const std::vector<int32_t>& parts) {
  std::string out;
  for (auto p : parts) {
    if (!out.empty()) out += ',';
    out += std::to_string(p);
  }
  return out;
}

}  // namespace kstate::server::api
