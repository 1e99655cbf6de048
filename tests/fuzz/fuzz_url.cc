// Fuzz target: request-target parsing and percent-decoding (server/http/src/url.cc).
//
// Input: a request target as a client sends it. parse_target() must accept exactly
// the targets the model below accepts and decode them to the same path segments and
// query parameters. The model is written from RFC 3986 (origin-form, pchar,
// pct-encoded) and the rules http/url.h documents, without Boost.URL.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "http/url.h"

namespace {

using kstate::http::request;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A byte allowed literally in a path segment or query: RFC 3986's unreserved,
// sub-delims, ':' and '@', plus the bytes kstate escapes leniently (url.cc) because
// clients send them unescaped. '/', '?' and '%' are handled by the caller.
bool literal_ok(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  if (c >= 0x80) return true;
  return std::string_view("-._~!$&'()*+,;=:@\"<>[\\]^`{|}").find(static_cast<char>(c)) != std::string_view::npos;
}

// Percent-decodes `s`, which the caller has checked; '+' becomes a space when asked.
std::string decode(std::string_view s, bool plus_is_space) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      out.push_back(static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2])));
      i += 2;
    } else if (s[i] == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    size_t at = s.find(sep, start);
    parts.push_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

struct model_result {
  std::string path;
  std::vector<std::string> segments;
  std::multimap<std::string, std::string> query;
};

std::optional<model_result> model(std::string_view target) {
  if (target.empty() || target.front() != '/') return std::nullopt;
  for (size_t i = 0; i < target.size(); ++i) {
    const auto c = static_cast<unsigned char>(target[i]);
    if (c == '%') {
      if (i + 2 >= target.size() || hex_value(target[i + 1]) < 0 || hex_value(target[i + 2]) < 0) return std::nullopt;
      i += 2;
    } else if (c != '/' && c != '?' && !literal_ok(c)) {
      return std::nullopt;  // controls, space, DEL, '#'
    }
  }
  model_result m;
  const size_t q = target.find('?');
  m.path = std::string(target.substr(0, q));
  // "/" has no segments; otherwise every '/' starts one, empty ones included.
  if (m.path != "/")
    for (auto seg : split(std::string_view(m.path).substr(1), '/')) m.segments.push_back(decode(seg, false));
  if (q != std::string_view::npos) {
    for (auto item : split(target.substr(q + 1), '&')) {
      const size_t eq = item.find('=');
      if (item.empty()) continue;  // "?" and "a&&b" carry nothing
      if (eq == std::string_view::npos) m.query.emplace(decode(item, true), "");
      else m.query.emplace(decode(item.substr(0, eq), true), decode(item.substr(eq + 1), true));
    }
  }
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view target(reinterpret_cast<const char*>(data), size);
  request req;
  const auto st = kstate::http::parse_target(target, req);
  const auto expected = model(target);
  FUZZ_CHECK(st.ok() == expected.has_value());
  if (!st.ok()) return 0;
  FUZZ_CHECK(req.path == expected->path);
  FUZZ_CHECK(req.segments == expected->segments);
  FUZZ_CHECK(req.query == expected->query);
  return 0;
}
