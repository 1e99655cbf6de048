#include "server/json_render.h"

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

#include "core/json_check.h"
#include "core/utf8.h"
#include "query/key_format.h"

namespace kstate::server {
namespace {

using json = nlohmann::json;

// Compact, member order kept: what a stored document that is not compact prints as.
void append_dumped(std::string& out, const nlohmann::ordered_json& j) {
  out += j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void append_dumped(std::string& out, const json& j) { out += j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  // dump() replaces invalid UTF-8 with U+FFFD; leave that case to it.
  if (!valid_utf8(s)) return append_dumped(out, json(std::string(s)));
  static const char hex[] = "0123456789abcdef";
  out.reserve(out.size() + s.size() + 2);
  out += '"';
  size_t run = 0;  // start of the pending run of bytes copied as they are
  for (size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 0xf]};
        out.append(u, sizeof u);
      }
    }
  }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}

bool append_compact_json(std::string& out, std::string_view doc) {
  // Invalid UTF-8 is left to dump(), which replaces it: an answer is always valid JSON.
  // The depth bound is the largest a store can be configured with: checking is a loop,
  // and a stored document is embedded without recursing into it.
  if (check_json(doc, max_max_json_depth, json_layout::compact) != json_verdict::ok) return false;
  out.append(doc.data(), doc.size());
  return true;
}

namespace {
// Values and keys render alike but for bytes: a value's bytes are base64 (the body of a
// JSON document), a key's are base64url, so that the rendered key can be put in a URL as is.
void append_rendered(std::string& out, data_format f, std::string_view bytes, std::string (*encode)(std::string_view)) {
  switch (f) {
    case data_format::json:
      // Validated at ingest (values) or at parse (keys); embedded as JSON, as stored
      // when it is compact (what producers write, and how keys are stored).
      if (!append_compact_json(out, bytes))
        append_dumped(out, nlohmann::ordered_json::parse(bytes.begin(), bytes.end(), nullptr, false));
      return;
    case data_format::string: return append_json_string(out, bytes);
    case data_format::bytes:
      out += '"';
      out += encode(bytes);
      out += '"';
      return;
  }
  out += "null";
}
}  // namespace

void append_rendered_value(std::string& out, data_format f, std::string_view bytes) {
  append_rendered(out, f, bytes, query::base64_encode);
}

void append_rendered_key(std::string& out, data_format f, std::string_view bytes) {
  append_rendered(out, f, bytes, query::base64url_encode);
}

void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_position(std::string& out, const position& p) {
  // Object keys print in string order: "10" sorts before "2".
  struct entry {
    char name[12];
    uint8_t len;
    int64_t offset;
    std::string_view view() const { return {name, len}; }
  };
  entry small[16];
  std::vector<entry> big;
  entry* e = small;
  if (p.size() > std::size(small)) {
    big.resize(p.size());
    e = big.data();
  }
  size_t n = 0;
  for (const auto& [part, off] : p) {
    auto r = std::to_chars(e[n].name, e[n].name + sizeof e[n].name, part);
    e[n].len = static_cast<uint8_t>(r.ptr - e[n].name);
    e[n].offset = off;
    ++n;
  }
  std::sort(e, e + n, [](const entry& a, const entry& b) { return a.view() < b.view(); });
  out += '{';
  for (size_t i = 0; i < n; ++i) {
    if (i) out += ',';
    out += '"';
    out.append(e[i].view());
    out += "\":";
    append_int(out, e[i].offset);
  }
  out += '}';
}

}  // namespace kstate::server
