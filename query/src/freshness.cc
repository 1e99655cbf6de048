#include "query/freshness.h"

namespace kstate::query {

freshness_waiter::freshness_waiter(const engine& queries, change_notifier& notifier, freshness_config cfg)
    : queries_(queries), cfg_(cfg) {
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
    if (waiters_.size() + in_flight_ >= cfg_.max_waiters || held_ + bytes > cfg_.max_bytes) {
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
  return waiters_.size() + in_flight_;
}

uint64_t freshness_waiter::refused() const {
  std::lock_guard lock(mu_);
  return refused_;
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
    in_flight_ = batch.size();
    bool stopping = stopping_;
    lock.unlock();
    std::list<waiter> keep;
    std::size_t released = 0;
    auto now = clock::now();
    for (auto& w : batch) {
      std::optional<wait_outcome> answer = stopping ? std::optional(wait_outcome::shutting_down) : check(w);
      if (!answer && now >= w.deadline) answer = wait_outcome::timed_out;
      if (answer) {
        released += w.bytes;
        w.done(*answer);
      } else {
        keep.push_back(std::move(w));
      }
    }
    lock.lock();
    held_ -= released;
    in_flight_ = 0;
    waiters_.splice(waiters_.end(), keep);
    if (stopping && waiters_.empty()) return;
  }
}

}  // namespace kstate::query
