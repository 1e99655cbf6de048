#include "server/json_render.h"

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

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

// A one-pass check that a document is compact JSON: the grammar of RFC 8259 with no
// whitespace outside strings. It never allocates; anything it is not sure about is "not
// compact" and the caller falls back to parse + dump.
class compact_checker {
 public:
  explicit compact_checker(std::string_view s) : s_(s) {}

  bool check() { return value(0) && i_ == s_.size(); }

 private:
  static constexpr int max_depth = 64;

  bool value(int depth) {
    if (i_ >= s_.size()) return false;
    switch (s_[i_]) {
      case '{': return object(depth + 1);
      case '[': return array(depth + 1);
      case '"': return string();
      case 't': return literal("true");
      case 'f': return literal("false");
      case 'n': return literal("null");
      default: return number();
    }
  }

  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  bool digit() const { return i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9'; }

  // One or more digits.
  bool digits() {
    if (!digit()) return false;
    while (digit()) ++i_;
    return true;
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool number() {
    if (s_[i_] == '-') ++i_;
    if (!digit()) return false;
    if (s_[i_] == '0') ++i_;
    else digits();
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (!digits()) return false;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) return false;
    }
    return true;
  }

  static bool hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

  bool string() {
    ++i_;
    for (;;) {
      if (i_ >= s_.size()) return false;
      auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') break;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (i_ + 1 >= s_.size()) return false;
        switch (s_[i_ + 1]) {
          case '"':
          case '\\':
          case '/':
          case 'b':
          case 'f':
          case 'n':
          case 'r':
          case 't': i_ += 2; continue;
          case 'u':
            if (i_ + 6 > s_.size() || !hex(s_[i_ + 2]) || !hex(s_[i_ + 3]) || !hex(s_[i_ + 4]) || !hex(s_[i_ + 5]))
              return false;
            i_ += 6;
            continue;
          default: return false;
        }
      }
      ++i_;
    }
    ++i_;  // closing quote
    return true;
  }

  bool object(int depth) {
    if (depth > max_depth) return false;
    ++i_;
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    for (;;) {
      if (i_ >= s_.size() || s_[i_] != '"') return false;
      if (!string()) return false;
      if (i_ >= s_.size() || s_[i_] != ':') return false;
      ++i_;
      if (!value(depth)) return false;
      if (i_ >= s_.size()) return false;
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (s_[i_] == '}') {
        ++i_;
        return true;
      }
      return false;
    }
  }

  bool array(int depth) {
    if (depth > max_depth) return false;
    ++i_;
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    for (;;) {
      if (!value(depth)) return false;
      if (i_ >= s_.size()) return false;
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (s_[i_] == ']') {
        ++i_;
        return true;
      }
      return false;
    }
  }

  std::string_view s_;
  size_t i_ = 0;
};

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
  if (!valid_utf8(doc)) return false;
  if (!compact_checker(doc).check()) return false;
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
