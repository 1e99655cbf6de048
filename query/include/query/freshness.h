#pragma once
// freshness_waiter: read-your-writes without holding a thread per request.
//
// A request with min_position registers here; one background thread re-checks the
// registered bounds whenever ingest announces a write (change_notifier) and calls each
// waiter back once its bound is reached or its deadline passes.
//
// Thread safety: wait() may be called from any thread. Callbacks run on the waiter's
// own thread, or (for a bound reached at once) inside wait(). The destructor answers
// every pending waiter with `false` and joins the thread.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

#include "core/notifier.h"
#include "core/types.h"
#include "query/engine.h"

namespace kstate::query {

class freshness_waiter {
 public:
  using clock = std::chrono::steady_clock;
  // reached: true when the bound was reached, false at the deadline (or shutdown, or
  // when the bound can never be reached here).
  using callback = std::function<void(bool reached)>;

  freshness_waiter(const engine& queries, change_notifier& notifier);
  ~freshness_waiter();
  freshness_waiter(const freshness_waiter&) = delete;
  freshness_waiter& operator=(const freshness_waiter&) = delete;

  void wait(std::string store, position bound, clock::time_point deadline, callback done);
  // Answers every pending waiter with `false` now, and every later one at once.
  void shutdown();
  size_t pending() const;

 private:
  struct waiter {
    std::string store;
    position bound;
    clock::time_point deadline;
    callback done;
  };
  void run();
  // nullopt: keep waiting; otherwise the answer.
  std::optional<bool> check(const waiter& w) const;

  const engine& queries_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<waiter> waiters_;
  uint64_t changes_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kstate::query
