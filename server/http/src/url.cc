#include "http/url.h"

#include <boost/url/encode.hpp>
#include <boost/url/encoding_opts.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/pct_string_view.hpp>
#include <boost/url/rfc/unreserved_chars.hpp>
#include <boost/url/url_view.hpp>

#include <string>
#include <string_view>

namespace kstate::http {
namespace {

// Bytes that RFC 3986 forbids in a path or query but that real clients send
// unescaped anyway (curl's globbing-off mode, browsers with "[", "|", "{", non-ASCII
// keys typed into the address bar). Their meaning is unambiguous, so they are escaped
// before Boost.URL's strict grammar sees them instead of failing the request. '%' is
// never touched: a malformed escape must still be rejected, and '#' stays an error
// because a fragment never belongs in a request target.
bool needs_lenient_escape(unsigned char c) {
  switch (c) {
    case '"':
    case '<':
    case '>':
    case '[':
    case '\\':
    case ']':
    case '^':
    case '`':
    case '{':
    case '|':
    case '}': return true;
    default: return c >= 0x80;
  }
}

std::string lenient_escape(std::string_view target) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(target.size());
  for (unsigned char c : target) {
    if (needs_lenient_escape(c)) {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 0xF]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

// A path character that needs no decoding: RFC 3986's pchar without pct-encoded
// (unreserved, sub-delims, ':' and '@'), or the '/' between segments.
bool plain_path_char(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '-':
    case '.':
    case '_':
    case '~':
    case '!':
    case '$':
    case '&':
    case '\'':
    case '(':
    case ')':
    case '*':
    case '+':
    case ',':
    case ';':
    case '=':
    case ':':
    case '@':
    case '/': return true;
    default: return false;
  }
}

}  // namespace

status parse_target(std::string_view target, request& req) {
  // Origin-form only ("/path?query"): that is what clients send to an origin server.
  // The grammar requires a leading '/', so "x/y", "*" and absolute-form are rejected.
  if (target.empty() || target.front() != '/') {
    return status::invalid_argument("request target must start with '/'");
  }
  // Most targets (a lookup of a plain key) are a path of plain characters and no query:
  // valid origin-form whose segments decode to themselves, split here without the
  // general parser's copies. The same segments as below, byte for byte.
  bool plain = true;
  for (unsigned char c : target)
    if (!plain_path_char(c)) {
      plain = false;
      break;
    }
  if (plain) {
    req.path = std::string(target);
    req.segments.clear();
    req.segments.reserve(8);  // /v1/stores/{store}/keys/{key} and its siblings: one allocation
    req.query.clear();
    std::string_view path = target;
    if (path != "/") {
      path.remove_prefix(1);
      for (;;) {
        const size_t slash = path.find('/');
        req.segments.emplace_back(path.substr(0, slash));
        if (slash == std::string_view::npos) break;
        path.remove_prefix(slash + 1);
      }
    }
    return {};
  }
  const std::string escaped = lenient_escape(target);
  auto parsed = boost::urls::parse_origin_form(escaped);
  if (!parsed) {
    // Boost.URL rejects "%zz", a truncated "%4" and a trailing "%" here: pct-encoded is
    // exactly '%' HEXDIG HEXDIG, so a bad escape never reaches the decoder.
    return status::invalid_argument("invalid request target (bad percent-encoding?): " + parsed.error().message());
  }
  const boost::urls::url_view& u = *parsed;

  // The raw path as the client sent it, before our lenient escaping.
  const auto q = target.find('?');
  req.path = std::string(target.substr(0, q));

  // Each segment is percent-decoded on its own, so "%2F" becomes a '/' inside one
  // segment, "%00" a NUL byte, and UTF-8 escapes their raw bytes. '+' in a path is a
  // literal plus: the form convention applies to queries only. Empty segments
  // ("/v1/stores//keys", a trailing '/') are kept; the router decides what they mean.
  // "/" has no segments. The path is split here rather than by Boost.URL's segments(),
  // which hides a leading "." segment (the "/." prefix it adds itself so that "//x" is
  // not read as an authority): "/./v1/stores" would have been routed as "/v1/stores"
  // while "/v1/./stores" is not.
  req.segments.clear();
  std::string_view path = u.encoded_path();
  if (path != "/") {
    path.remove_prefix(1);
    for (;;) {
      const size_t slash = path.find('/');
      // Already validated by parse_origin_form, so value() cannot throw.
      req.segments.push_back(boost::urls::make_pct_string_view(path.substr(0, slash)).value().decode());
      if (slash == std::string_view::npos) break;
      path.remove_prefix(slash + 1);
    }
  }

  // Query values follow application/x-www-form-urlencoded: '+' decodes to a space.
  // Browsers and most HTTP client libraries (Python requests, Java URLEncoder, JS
  // URLSearchParams) encode spaces in query values that way, so treating '+' literally
  // would silently corrupt their keys; a client that means a literal plus sends "%2B".
  req.query.clear();
  if (u.has_query()) {
    for (auto p : u.params(boost::urls::encoding_opts{/*space_as_plus=*/true, false, false})) {
      // "?" and "a&&b" produce empty items with no key and no value; they carry nothing.
      if (p.key.empty() && !p.has_value) continue;
      req.query.emplace(std::move(p.key), std::move(p.value));
    }
  }
  return {};
}

std::string percent_encode(std::string_view s) {
  boost::urls::encoding_opts opt;
  opt.space_as_plus = false;
  return boost::urls::encode(s, boost::urls::unreserved_chars, opt);
}

}  // namespace kstate::http
