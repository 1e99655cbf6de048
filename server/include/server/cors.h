#pragma once
// CORS: lets pages from an explicit list of origins call the API from a browser.
// Off unless origins are listed. Preflights (OPTIONS with Access-Control-Request-Method)
// are answered here, before authentication (browsers send no credentials on them);
// every other request goes to the wrapped handler, and answers to an allowed origin
// carry Access-Control-Allow-Origin naming that origin (never "*") and expose kstate's
// response headers. No Access-Control-Allow-Credentials: tokens travel in the
// Authorization header, not in cookies.

#include <string>
#include <vector>

#include "http/message.h"

namespace kstate::server {

struct cors_config {
  // Exact origins ("https://dash.example.com") whose pages may call the API; never "*".
  std::vector<std::string> allowed_origins;
  // How long a browser may cache a preflight answer, seconds. Default 600.
  int max_age_s = 600;
};

// `inner` with CORS; `inner` itself when no origin is allowed.
http::async_handler with_cors(cors_config cfg, http::async_handler inner);

}  // namespace kstate::server
