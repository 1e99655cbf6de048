#include "query/freshness.h"

namespace kstate::query {

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

void freshness_waiter::run() {
  std::unique_lock lock(mu_);
  uint64_t seen = 0;
  for (;;) {
    auto next_deadline = clock::time_point::max();
    for (const auto& w : waiters_) next_deadline = std::min(next_deadline, w.deadline);
    cv_.wait_until(lock, next_deadline, [&] { return stopping_ || changes_ != seen || clock::now() >= next_deadline; });
    seen = changes_;
    // Check outside the lock: reads RocksDB.
    std::list<waiter> batch;
    batch.swap(waiters_);
    bool stopping = stopping_;
    lock.unlock();
    std::list<waiter> keep;
    auto now = clock::now();
    for (auto& w : batch) {
      std::optional<bool> answer = stopping ? std::optional<bool>(false) : check(w);
      if (!answer && now >= w.deadline) answer = false;
      if (answer) w.done(*answer);
      else keep.push_back(std::move(w));
    }
    lock.lock();
    waiters_.splice(waiters_.end(), keep);
    if (stopping && waiters_.empty()) return;
  }
}

}  // namespace kstate::query
