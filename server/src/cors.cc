#include "server/cors.h"

#include <algorithm>
#include <memory>

#include "server/problem.h"

namespace kstate::server {
namespace {

// Methods the API answers, and request headers a page may send.
constexpr const char* allowed_methods = "GET, HEAD, POST";
constexpr const char* allowed_headers = "Authorization, Content-Type, Accept, X-Request-Id, X-Kstate-Min-Position";
// Response headers a page may read besides the CORS-safelisted ones.
constexpr const char* exposed_headers =
    "X-Request-Id, X-Kstate-Position, X-Kstate-Forwarded-To, Retry-After, Link, WWW-Authenticate";

bool method_allowed(const std::string& m) { return m == "GET" || m == "HEAD" || m == "POST"; }

}  // namespace

http::async_handler with_cors(cors_config cfg, http::async_handler inner) {
  if (cfg.allowed_origins.empty()) return inner;
  auto c = std::make_shared<const cors_config>(std::move(cfg));
  return [c, inner = std::move(inner)](const http::request& req, const http::responder& reply) {
    const auto origin = req.header("origin");
    const bool allowed =
        origin && std::find(c->allowed_origins.begin(), c->allowed_origins.end(), *origin) != c->allowed_origins.end();
    if (req.method == "OPTIONS" && origin && req.header("access-control-request-method")) {
      const auto method = *req.header("access-control-request-method");
      if (!allowed)
        return reply(problem(failure_reason::forbidden,
                             "origin '" + origin->substr(0, 256) + "' is not allowed (http.cors.allowed_origins)",
                             req.path)
                         .with_header("Vary", "Origin"));
      if (!method_allowed(method))
        return reply(problem(failure_reason::method_not_allowed,
                             "cross-origin " + method.substr(0, 32) + " is not allowed", req.path)
                         .with_header("Allow", allowed_methods)
                         .with_header("Vary", "Origin"));
      http::response r;
      r.status = 204;
      r.content_type.clear();
      r.with_header("Access-Control-Allow-Origin", *origin)
          .with_header("Access-Control-Allow-Methods", allowed_methods)
          .with_header("Access-Control-Allow-Headers", allowed_headers)
          .with_header("Access-Control-Max-Age", std::to_string(c->max_age_s))
          .with_header("Vary", "Origin");
      return reply(std::move(r));
    }
    if (!allowed) {
      // Answers still vary by Origin for caches, though this one carries no CORS headers.
      return inner(req, [reply](http::response r) { reply(std::move(r.with_header("Vary", "Origin"))); });
    }
    inner(req, [reply, o = *origin](http::response r) {
      r.with_header("Access-Control-Allow-Origin", o)
          .with_header("Access-Control-Expose-Headers", exposed_headers)
          .with_header("Vary", "Origin");
      reply(std::move(r));
    });
  };
}

}  // namespace kstate::server
