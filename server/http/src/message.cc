#include "http/message.h"

#include "syntax.h"

namespace kstate::http {
using syntax::iequals;

std::optional<std::string> request::header(std::string_view name) const {
  // Names are stored lower-cased by the server, but a request built by hand (tests,
  // an embedding application) may not be, so both sides are folded.
  for (const auto& [n, v] : headers) {
    if (iequals(n, name)) return v;
  }
  return std::nullopt;
}

std::optional<std::string> request::param(std::string_view name) const {
  // multimap keeps equal keys in insertion order, so lower_bound is the first one the
  // client sent (find() may return any of them).
  const std::string key(name);
  auto it = query.lower_bound(key);
  if (it == query.end() || it->first != key) return std::nullopt;
  return it->second;
}

}  // namespace kstate::http
