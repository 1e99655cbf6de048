#include "core/status.h"

namespace kstate {

const char* to_string(status_code c) noexcept {
  switch (c) {
    case status_code::ok: return "ok";
    case status_code::invalid_argument: return "invalid_argument";
    case status_code::not_found: return "not_found";
    case status_code::unavailable: return "unavailable";
    case status_code::deadline_exceeded: return "deadline_exceeded";
    case status_code::resource_exhausted: return "resource_exhausted";
    case status_code::io_error: return "io_error";
    case status_code::corruption: return "corruption";
    case status_code::internal: return "internal";
  }
  return "unknown";
}

std::string status::to_string() const {
  if (ok()) return "ok";
  return std::string(kstate::to_string(code_)) + ": " + message_;
}

}  // namespace kstate
