#include "http/problem.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>

namespace kstate::http {

response problem(unsigned status, std::string_view type, std::string_view title, std::string_view detail,
                 std::string_view instance, std::initializer_list<std::pair<std::string_view, int64_t>> int_members,
                 int retry_after_s) {
  // Members in dump()'s order (sorted by name), so an answer's bytes do not depend on
  // how it was put together.
  nlohmann::json body = {
      {"type", type.empty() ? std::string_view("about:blank") : type},
      {"title", title},
      {"status", status},
      {"detail", detail},
  };
  if (!instance.empty()) body["instance"] = instance;
  for (const auto& [name, value] : int_members) body[std::string(name)] = value;

  response res;
  res.status = status;
  res.content_type = "application/problem+json";
  // detail and instance can carry decoded request bytes (a binary key, a bad path) that
  // are not UTF-8; dump() would throw on them, so invalid sequences become U+FFFD.
  res.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (status == 503) res.with_header("Retry-After", std::to_string(std::max(retry_after_s, 0)));
  return res;
}

response default_error(server_error e, std::string_view detail, std::string_view instance) {
  switch (e) {
    case server_error::bad_request: return problem(400, {}, "Bad Request", detail, instance);
    case server_error::bad_target: return problem(400, {}, "Bad Request", detail, instance);
    case server_error::payload_too_large: return problem(413, {}, "Content Too Large", detail, instance);
    case server_error::uri_too_long: return problem(414, {}, "URI Too Long", detail, instance);
    case server_error::headers_too_large: return problem(431, {}, "Request Header Fields Too Large", detail, instance);
    case server_error::internal: return problem(500, {}, "Internal Server Error", detail, instance);
    case server_error::overloaded: return problem(503, {}, "Service Unavailable", detail, instance);
  }
  return problem(500, {}, "Internal Server Error", detail, instance);
}

}  // namespace kstate::http
