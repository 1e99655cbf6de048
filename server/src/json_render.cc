#include "server/json_render.h"

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

#include "core/utf8.h"
#include "query/key_format.h"

namespace kstate::server {
namespace {

using json = nlohmann::json;

void append_dumped(std::string& out, const json& j) { out += j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A one-pass check of the canonical form append_canonical_json() promises. It never
// allocates; anything it is not sure about is "not canonical" and the caller falls back
// to parse + dump.
class canonical_checker {
 public:
  explicit canonical_checker(std::string_view s) : s_(s) {}

  bool check() { return value(0) && i_ == s_.size(); }

 private:
  static constexpr int max_depth = 64;

  bool value(int depth) {
    if (i_ >= s_.size()) return false;
    switch (s_[i_]) {
      case '{': return object(depth + 1);
      case '[': return array(depth + 1);
      case '"': return string(nullptr);
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

  // dump() prints integers as they were written, if they have no leading zero, are not
  // "-0" and fit 64 bits (these limits are stricter than that). Fractions and exponents
  // come back reformatted by dump(): not canonical.
  bool number() {
    size_t start = i_;
    bool negative = false;
    if (s_[i_] == '-') {
      negative = true;
      ++i_;
    }
    size_t digits = i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    size_t n = i_ - digits;
    if (n == 0) return false;
    if (s_[digits] == '0' && (n > 1 || negative)) return false;
    if (n > 18) return false;
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) return false;
    return i_ > start;
  }

  // `raw_key`, when given, receives the string's bytes between the quotes; keys with
  // escapes are refused, so that raw bytes order the same as decoded ones.
  bool string(std::string_view* raw_key) {
    size_t start = ++i_;
    for (;;) {
      if (i_ >= s_.size()) return false;
      auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') break;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (raw_key) return false;
        if (i_ + 1 >= s_.size()) return false;
        switch (s_[i_ + 1]) {
          // Exactly the escapes dump() writes for these characters.
          case '"':
          case '\\':
          case 'b':
          case 'f':
          case 'n':
          case 'r':
          case 't': break;
          default: return false;  // \/ and \uXXXX come back in another form
        }
        i_ += 2;
        continue;
      }
      ++i_;
    }
    if (raw_key) *raw_key = s_.substr(start, i_ - start);
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
    std::string_view prev;
    bool first = true;
    for (;;) {
      if (i_ >= s_.size() || s_[i_] != '"') return false;
      std::string_view key;
      if (!string(&key)) return false;
      // dump() prints members in std::map order (bytes compared as unsigned char); a
      // duplicate or out-of-order key comes back changed.
      if (!first && !(prev < key)) return false;
      prev = key;
      first = false;
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

bool append_canonical_json(std::string& out, std::string_view doc) {
  // Strings must be valid UTF-8 for dump() to print them back unchanged.
  if (!valid_utf8(doc)) return false;
  if (!canonical_checker(doc).check()) return false;
  out.append(doc.data(), doc.size());
  return true;
}

namespace {
// Values and keys render alike but for bytes: a value's bytes are base64 (the body of a
// JSON document), a key's are base64url, so that the rendered key can be put in a URL as is.
void append_rendered(std::string& out, data_format f, std::string_view bytes, std::string (*encode)(std::string_view)) {
  switch (f) {
    case data_format::json:
      // Validated at ingest (values) or at parse (keys); embedded as JSON.
      if (!append_canonical_json(out, bytes))
        append_dumped(out, json::parse(bytes.begin(), bytes.end(), nullptr, false));
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
