#pragma once
#include <string_view>

namespace kstate::server {
// docs/openapi.json, embedded at build time (see server/CMakeLists.txt).
std::string_view openapi_json();
}  // namespace kstate::server
