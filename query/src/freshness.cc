#include "query/freshness.h"

#include <spdlog/spdlog.h>

#include "core/guard.h"
#include "core/log.h"
#include "core/thread_name.h"

namespace kstate::query {
namespace {

std::shared_ptr<spdlog::logger> log() {
  static const auto l = module_logger("query");
  return l;
}

}  // namespace

freshness_waiter::freshness_waiter(const engine& queries, change_notifier& notifier, freshness_config cfg)
    : queries_(queries), cfg_(cfg) {
  notifier.subscribe([this] {
    {
      std::lock_guard lock(mu_);
      ++changes_;
    }
    cv_.notify_one();
  });
  thread_ = std::thread([this] {
    name_this_thread("ks-waits");
    run();
  });
}

freshness_waiter::~freshness_waiter() {
  shutdown();
  thread_.join();
}

void freshness_waiter::shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
}

std::optional<wait_outcome> freshness_waiter::check(const waiter& w) const {
  auto r = queries_.reached(w.store, w.bound);
  // Unknown store, or a partition not held here: it can never be answered here.
  if (!r.ok()) return wait_outcome::not_here;
  if (r.answer()) return wait_outcome::reached;
  return std::nullopt;
}

bool freshness_waiter::wait(std::string store, position bound, clock::time_point deadline, std::size_t bytes,
                            callback done) {
  waiter w{std::move(store), std::move(bound), deadline, bytes, std::move(done)};
  if (auto now = check(w)) {
    w.done(*now);
    return true;
  }
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      w.done(wait_outcome::shutting_down);
      return true;
    }
    if (waiters_.size() + checking_ >= cfg_.max_waiters || held_ + bytes > cfg_.max_bytes) {
      ++refused_;
      return false;
    }
    held_ += bytes;
    waiters_.push_back(std::move(w));
    ++changes_;  // a write may have landed between check() and here: look again
  }
  cv_.notify_one();
  return true;
}

size_t freshness_waiter::pending() const {
  std::lock_guard lock(mu_);
  return waiters_.size() + checking_;
}

uint64_t freshness_waiter::refused() const {
  std::lock_guard lock(mu_);
  return refused_;
}

void freshness_waiter::answer(waiter& w, wait_outcome outcome) {
  {
    std::lock_guard lock(mu_);
    held_ -= w.bytes;
  }
  if (auto why = guarded([&] { w.done(outcome); }))
    log()->error("answering a min_position wait on store {} failed: {}", w.store, *why);
}

void freshness_waiter::run() {
  for (;;) {
    bool stopped = false;
    if (auto why = guarded([&] { stopped = pass(); })) {
      log()->critical("freshness waiter: a pass failed: {}; pending min_position waits answered as not reached", *why);
      fail_pending();
      continue;
    }
    if (stopped) return;
  }
}

bool freshness_waiter::pass() {
  std::unique_lock lock(mu_);
  auto next_deadline = clock::time_point::max();
  for (const auto& w : waiters_) next_deadline = std::min(next_deadline, w.deadline);
  cv_.wait_until(lock, next_deadline, [&] { return stopping_ || changes_ != seen_ || clock::now() >= next_deadline; });
  seen_ = changes_;
  // Check outside the lock: reads RocksDB.
  in_flight_.swap(waiters_);
  checking_ = in_flight_.size();
  bool stopping = stopping_;
  lock.unlock();
  auto now = clock::now();
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    std::optional<wait_outcome> outcome;
    if (stopping) {
      outcome = wait_outcome::shutting_down;
    } else if (auto why = guarded([&] { outcome = check(*it); })) {
      log()->error("checking a min_position wait on store {} failed: {}; answered as not held here", it->store, *why);
      outcome = wait_outcome::not_here;
    }
    if (!outcome && now >= it->deadline) outcome = wait_outcome::timed_out;
    if (!outcome) {
      ++it;
      continue;
    }
    // Out of in_flight_ before the callback runs: answered once, whatever it does.
    waiter w = std::move(*it);
    it = in_flight_.erase(it);
    {
      std::lock_guard answered(mu_);
      --checking_;
    }
    answer(w, *outcome);
  }
  lock.lock();
  checking_ = 0;
  // Ahead of the waits registered during the pass: waits are answered in the order
  // they came, whatever passes ran in between.
  waiters_.splice(waiters_.begin(), in_flight_);
  return stopping && waiters_.empty();
}

void freshness_waiter::fail_pending() {
  std::list<waiter> pending;
  {
    std::lock_guard lock(mu_);
    pending.swap(in_flight_);
    pending.splice(pending.end(), waiters_);
    checking_ = 0;
  }
  for (auto& w : pending) answer(w, wait_outcome::timed_out);
}

}  // namespace kstate::query
