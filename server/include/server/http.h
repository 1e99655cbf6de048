#pragma once
// Plain request/response types for handlers. Handlers are functions from request to
// response and never touch sockets; Boost.Beast stays inside http_server.cc.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kstate::server {

struct http_request {
  std::string method;                         // "GET", "POST", ...
  std::string target;                         // raw request target, e.g. "/v1/stores/a%2Fb/keys/x?key_format=string"
  std::string path;                           // raw (still percent-encoded) path part of target
  std::vector<std::string> segments;          // path segments, percent-decoded (may contain '/', NUL)
  std::multimap<std::string, std::string> query;  // decoded query parameters, in order of appearance
  std::vector<std::pair<std::string, std::string>> headers;  // as received; names lower-cased
  std::string body;
  std::string request_id;                     // X-Request-Id from the client, or generated

  // First value of a header (name compared case-insensitively), if present.
  std::optional<std::string> header(std::string_view name) const;
  // First value of a query parameter, if present.
  std::optional<std::string> param(std::string_view name) const;
};

struct http_response {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (Retry-After, Link, ...)

  http_response& with_header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
    return *this;
  }
};

using http_handler = std::function<http_response(const http_request&)>;

}  // namespace kstate::server
