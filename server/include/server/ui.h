#pragma once
// The dashboard: static files built from web/ and served under /ui/ by every instance.

#include <optional>
#include <string>

#include "http/message.h"

namespace kstate::server {

// Answers GET/HEAD requests under /ui/ from the files in `dir` (the built dashboard).
// Hashed assets get long cache lifetimes; index.html is never cached. Paths that try to
// leave `dir` are refused. nullopt when the request is not for /ui.
std::optional<http::response> serve_ui(const http::request& req, const std::string& dir);

}  // namespace kstate::server
