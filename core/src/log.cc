#include "core/log.h"

#include <spdlog/spdlog.h>

namespace kstate {

std::shared_ptr<spdlog::logger> module_logger(const std::string& name) {
  if (auto existing = spdlog::get(name)) return existing;
  auto created = spdlog::default_logger()->clone(name);
  try {
    spdlog::register_logger(created);
  } catch (const spdlog::spdlog_ex&) {
    // Another thread (or the embedding application) registered it since get().
    if (auto existing = spdlog::get(name)) return existing;
  }
  return created;
}

}  // namespace kstate
