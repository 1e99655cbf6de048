#pragma once
// freshness_waiter: read-your-writes without holding a thread per request.
//
// A request with min_position registers here; one background thread re-checks the
// registered bounds whenever ingest announces a write (change_notifier) and calls each
// waiter back once its bound is reached, its deadline passes, or shutdown begins.
//
// Bounded: at most `max_waiters` waits at once, holding at most `max_bytes` (each wait
// says how much it holds: the request it will answer). A wait beyond either is refused
// at once, so a flood of waiting requests cannot grow memory; the caller answers 503.
//
// Thread safety: wait() may be called from any thread. Callbacks run on the waiter's
// own thread, or (for a bound reached at once) inside wait(). The destructor answers
// every pending waiter with shutting_down and joins the thread.
//
// Failures on the waiter's thread never end the process and never leave a waiter
// unanswered: a check that throws answers its waiter not_here; a callback that throws
// is logged and the others are still answered; anything else that escapes a pass
// answers every pending waiter timed_out, is logged (critical, logger `query`) and the
// thread goes on.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

#include "core/notifier.h"
#include "core/types.h"
#include "query/engine.h"

namespace kstate::query {

struct freshness_config {
  // Waits registered at once. Default 10,000.
  std::size_t max_waiters = 10'000;
  // Bytes the registered waits may hold together (their requests). Default 64 MiB.
  std::size_t max_bytes = 64u << 20;
};

enum class wait_outcome {
  reached,        // every partition of the bound applied the offset it names
  timed_out,      // the deadline passed first
  not_here,       // a partition of the bound is not held here: it never will be reached here
  shutting_down,  // the waiter is shutting down
};

class freshness_waiter {
 public:
  using clock = std::chrono::steady_clock;
  using callback = std::function<void(wait_outcome)>;

  freshness_waiter(const engine& queries, change_notifier& notifier, freshness_config cfg = {});
  ~freshness_waiter();
  freshness_waiter(const freshness_waiter&) = delete;
  freshness_waiter& operator=(const freshness_waiter&) = delete;

  // Calls `done` once `bound` is reached in `store` (or the deadline passes, ...).
  // `bytes`: what the callback holds. False, without calling `done`, when the limits
  // are reached (max_waiters, max_bytes).
  [[nodiscard]] bool wait(std::string store, position bound, clock::time_point deadline, std::size_t bytes,
                          callback done);
  // Answers every pending waiter with shutting_down now, and every later one at once.
  void shutdown();
  size_t pending() const;
  // Waits refused at the limits since start.
  uint64_t refused() const;

 private:
  struct waiter {
    std::string store;
    position bound;
    clock::time_point deadline;
    std::size_t bytes;
    callback done;
  };
  void run();
  // One pass: waits for a change or a deadline, then answers what it can. True when
  // stopped and nothing is pending. Waiter thread only.
  bool pass();
  // nullopt: keep waiting; otherwise the answer.
  std::optional<wait_outcome> check(const waiter& w) const;
  // Calls w.done(outcome) and releases its bytes; a callback that throws is logged,
  // not propagated.
  void answer(waiter& w, wait_outcome outcome);
  // Answers every pending waiter timed_out (after a pass failed).
  void fail_pending();

  const engine& queries_;
  const freshness_config cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<waiter> waiters_;  // guarded by mu_
  // Waiters a pass took out of waiters_ to check without the lock (waiter thread only),
  // so that a pass that fails half-way still answers them.
  std::list<waiter> in_flight_;
  std::size_t checking_ = 0;  // in_flight_.size() as pending() sees it, guarded by mu_
  std::size_t held_ = 0;      // waiters' bytes (including those being checked), guarded by mu_
  uint64_t refused_ = 0;      // guarded by mu_
  uint64_t seen_ = 0;         // changes_ as of the last pass (waiter thread only)
  uint64_t changes_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kstate::query
