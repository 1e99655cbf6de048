#pragma once
// guarded(): the last resort of a background thread.
//
// kstate reports failures as status values. An exception that still reaches the top of
// a thread (std::bad_alloc, a bug, a callback that throws) would call std::terminate
// and end the process with nothing in the log. Each thread body, and each callback a
// C library calls (an exception must not unwind through librdkafka's C frames), runs
// under guarded(), which turns whatever escaped into a description; the thread's owner
// logs it and decides what follows (stop the process, stop the component, answer the
// waiters).
//
// Thread safety: stateless; any thread.

#include <exception>
#include <optional>
#include <string>
#include <utility>

namespace kstate {

// What the exception being handled says; call only inside a catch block.
inline std::string describe_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Runs body(). nullopt when it returned; otherwise what it threw, described.
template <typename F>
std::optional<std::string> guarded(F&& body) {
  try {
    std::forward<F>(body)();
    return std::nullopt;
  } catch (...) {
    return describe_current_exception();
  }
}

}  // namespace kstate
