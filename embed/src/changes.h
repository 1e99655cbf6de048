#pragma once
// The change listeners of a node (internal to the embedding library): the hub that
// ingest's writer hands applied changes to (ingest/changes.h), and one bounded queue
// and delivery thread per subscription.
//
// Back-pressure: the writer thread waits while a subscription's queue is full, so a
// slow listener slows ingest (its writer's queue fills, then fetching pauses) instead
// of growing memory. A cancelled subscription takes nothing more and lets a waiting
// writer go on at once, so a cancel never waits for ingest and ingest never waits for
// a listener that left.
//
// Threading: any()/observes()/applied() on ingest's writer thread; add() and cancel
// from the application's threads.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "ingest/changes.h"
#include "kstate/kstate.h"

namespace kstate::embed {

struct subscription::impl {
  impl(std::string store, std::function<void(const change&)> cb, std::size_t max_queued);
  ~impl();

  // Queues the changes, waiting for room while the queue is full; returns at once (the
  // rest dropped) once the subscription is cancelled.
  void push(std::vector<change>& changes);
  // Delivers what is queued, then ends the thread. Idempotent; from any thread but the
  // delivery thread.
  void cancel();
  bool cancelled() const;

  const std::string store;
  const std::function<void(const change&)> on_change;
  const std::size_t max_queued;
  std::atomic<uint64_t> delivered{0};
  // Called once cancelled, so the hub forgets this subscription.
  std::function<void()> on_cancel;

 private:
  void run();

  mutable std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<change> queue_;  // guarded by mu_
  bool closing_ = false;      // guarded by mu_
  std::thread thread_;
  std::once_flag joined_;
};

namespace detail {

class change_hub final : public ingest::change_observer {
 public:
  bool any() const override { return count_.load(std::memory_order_relaxed) > 0; }
  bool observes(std::string_view view) const override;
  void applied(std::vector<ingest::applied_change> changes) override;

  void add(std::shared_ptr<subscription::impl> s);
  void remove(const subscription::impl* s);
  // Every current subscription (node::stop cancels them).
  std::vector<std::shared_ptr<subscription::impl>> all() const;

 private:
  mutable std::shared_mutex mu_;
  std::vector<std::shared_ptr<subscription::impl>> subs_;  // guarded by mu_
  std::atomic<std::size_t> count_{0};
};

}  // namespace detail
}  // namespace kstate::embed
