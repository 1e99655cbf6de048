#pragma once
// The server module's logger ("server"), internal to the module.

#include <spdlog/spdlog.h>

#include <memory>

#include "core/log.h"

namespace kstate::server {

inline const std::shared_ptr<spdlog::logger>& server_log() {
  static const auto l = module_logger("server");
  return l;
}

}  // namespace kstate::server
