#include "query/freshness.h"

#include <spdlog/spdlog.h>

#include "core/guard.h"

namespace kstate::query {
namespace {

// The "query" logger, created on first use; safe from any thread.
std::shared_ptr<spdlog::logger> log() {
  static auto l = [] {
    if (auto existing = spdlog::get("query")) return existing;
    auto created = spdlog::default_logger()->clone("query");
    try {
      spdlog::register_logger(created);
    } catch (const spdlog::spdlog_ex&) {
      // Registered by an embedding application first: use that one.
      if (auto existing = spdlog::get("query")) return existing;
    }
    return created;
  }();
  return l;
}

}  // namespace

freshness_waiter::freshness_waiter(const engine& queries, change_notifier& notifier) : queries_(queries) {
  notifier.subscribe([this] {
    {
      std::lock_guard lock(mu_);
      ++changes_;
    }
    cv_.notify_one();
  });
  thread_ = std::thread([this] { run(); });
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

std::optional<bool> freshness_waiter::check(const waiter& w) const {
  auto r = queries_.reached(w.store, w.bound);
  if (!r.ok()) return false;  // can never be answered here (unknown store, partition elsewhere)
  if (*r.answer) return true;
  return std::nullopt;
}

void freshness_waiter::wait(std::string store, position bound, clock::time_point deadline, callback done) {
  waiter w{std::move(store), std::move(bound), deadline, std::move(done)};
  if (auto now = check(w)) {
    w.done(*now);
    return;
  }
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      w.done(false);
      return;
    }
    waiters_.push_back(std::move(w));
    ++changes_;  // a write may have landed between check() and here: look again
  }
  cv_.notify_one();
}

size_t freshness_waiter::pending() const {
  std::lock_guard lock(mu_);
  return waiters_.size();
}

void freshness_waiter::answer(waiter& w, bool reached) {
  if (auto why = guarded([&] { w.done(reached); }))
    log()->error("answering a min_position wait on store {} failed: {}", w.store, *why);
}

void freshness_waiter::run() {
  for (;;) {
    bool stopped = false;
    if (auto why = guarded([&] { stopped = pass(); })) {
      log()->critical("freshness waiter: a pass failed: {}; pending min_position waits answered as not reached",
                      *why);
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
  bool stopping = stopping_;
  lock.unlock();
  auto now = clock::now();
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    std::optional<bool> reached;
    if (stopping) {
      reached = false;
    } else if (auto why = guarded([&] { reached = check(*it); })) {
      log()->error("checking a min_position wait on store {} failed: {}; answered as not reached", it->store, *why);
      reached = false;
    }
    if (!reached && now >= it->deadline) reached = false;
    if (!reached) {
      ++it;
      continue;
    }
    // Out of in_flight_ before the callback runs: answered once, whatever it does.
    waiter w = std::move(*it);
    it = in_flight_.erase(it);
    answer(w, *reached);
  }
  lock.lock();
  waiters_.splice(waiters_.end(), in_flight_);
  return stopping && waiters_.empty();
}

void freshness_waiter::fail_pending() {
  std::list<waiter> pending;
  {
    std::lock_guard lock(mu_);
    pending.swap(in_flight_);
    pending.splice(pending.end(), waiters_);
  }
  for (auto& w : pending) answer(w, false);
}

}  // namespace kstate::query
