#pragma once
// module_logger(): the one way a kstate module gets its logger.
//
// Each module logs under its own name ("ingest", "storage", "query", "http",
// "server"), so an operator can set levels per module. An embedding application that
// registered a logger of that name with spdlog first gets its logger used; otherwise a
// clone of spdlog's default logger (its sinks, level and pattern at the time of the
// first call) is registered under the name.
//
// Thread safety: any thread; two first calls racing for one name get the same logger.

#include <memory>
#include <string>

namespace spdlog {
class logger;
}

namespace kstate {

std::shared_ptr<spdlog::logger> module_logger(const std::string& name);

}  // namespace kstate
