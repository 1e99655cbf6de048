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
//
// Failures on the waiter's thread never end the process and never leave a waiter
// unanswered: a check that throws answers its waiter `false`; a callback that throws is
// logged and the others are still answered; anything else that escapes a pass answers
// every pending waiter `false`, is logged (critical, logger `query`) and the thread goes
// on.

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
  // One pass: waits for a change or a deadline, then answers what it can. True when
  // stopped and nothing is pending. Waiter thread only.
  bool pass();
  // nullopt: keep waiting; otherwise the answer.
  std::optional<bool> check(const waiter& w) const;
  // Calls w.done(reached); a callback that throws is logged, not propagated.
  static void answer(waiter& w, bool reached);
  // Answers every pending waiter `false` (after a pass failed).
  void fail_pending();

  const engine& queries_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<waiter> waiters_;
  // Waiters a pass took out of waiters_ to check without the lock (waiter thread only),
  // so that a pass that fails half-way still answers them.
  std::list<waiter> in_flight_;
  uint64_t seen_ = 0;  // changes_ as of the last pass (waiter thread only)
  uint64_t changes_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kstate::query
