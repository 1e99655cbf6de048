#pragma once
// apply_stage (internal to ingest): the thread that writes the owner's batches, so the
// ingest thread goes on polling Kafka while RocksDB works (docs/DESIGN.md, invariant 7).
//
// The ingest thread builds a batch (state changes and the positions they reach, one
// storage::write_batch) and submit()s it; the stage's thread applies batches one at a
// time, in the order submitted, with the function it was made with. The queue is
// bounded in bytes: submit() never blocks, and the ingest thread asks full() and
// waits for room (wait_for_room) before it polls more, so a slow disk slows fetching
// instead of growing memory. drain() waits until everything submitted is applied: a
// rebalance and a stop call it, so that no batch of a partition is applied after its
// revocation completed.
//
// Once the apply function fails, the stage applies nothing more: later batches are
// dropped and drain() returns false. What failed is the apply function's to report.
//
// Threading: submit(), full(), drained(), drain() and stop() on one thread (the ingest
// thread, or the caller of stop() after it was joined); the apply function runs on the
// stage's own thread.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ingest/batch_builder.h"

namespace kstate::ingest {

class apply_stage {
 public:
  // Applies one batch; false stops the stage (the function reported why).
  using apply_fn = std::function<bool(built_batch&)>;

  // `max_queued_bytes`: the most batch bytes waiting (the batch being applied not
  // counted); a batch larger than it is still taken when the queue is empty.
  apply_stage(apply_fn apply, std::size_t max_queued_bytes);
  ~apply_stage();
  apply_stage(const apply_stage&) = delete;
  apply_stage& operator=(const apply_stage&) = delete;

  // Queues a batch for the stage's thread. Never blocks. False when the stage failed
  // (the batch is dropped).
  bool submit(built_batch b);
  // True while the queued bytes reach max_queued_bytes: the caller should stop fetching.
  bool full() const { return queued_bytes_.load(std::memory_order_relaxed) >= max_bytes_; }
  // True once the queued bytes fell below half of max_queued_bytes: the caller may
  // fetch again.
  bool drained() const { return queued_bytes_.load(std::memory_order_relaxed) < max_bytes_ / 2; }
  // Bytes of the batches waiting and of the one being written.
  std::size_t pending_bytes() const { return pending_bytes_.load(std::memory_order_relaxed); }
  // Waits until every submitted batch was applied (or the stage failed). False when the
  // stage failed.
  bool drain();
  // Waits until the queue is not full, the stage failed, or `timeout` passed.
  void wait_for_room(std::chrono::milliseconds timeout);
  // A cleared write_batch of an applied batch, to build the next one in without a new
  // allocation; an empty optional when none is free.
  std::optional<storage::write_batch> recycled();
  // Applies what is queued (unless the stage failed), then ends the thread. Idempotent.
  void stop();

  bool failed() const;

 private:
  void run();

  apply_fn apply_;
  const std::size_t max_bytes_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the stage's thread waits for batches or stop
  std::condition_variable idle_cv_;  // drain() waits for the queue to empty
  std::condition_variable room_cv_;  // wait_for_room() waits for the queue to shrink
  std::deque<built_batch> queue_;    // guarded by mu_
  // Written under mu_; read without it by full(), drained() and pending_bytes().
  std::atomic<std::size_t> queued_bytes_{0};
  std::atomic<std::size_t> pending_bytes_{0};
  bool busy_ = false;                        // a batch is being applied; guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  bool failed_ = false;                      // guarded by mu_
  std::vector<storage::write_batch> spare_;  // cleared batches to reuse; guarded by mu_
  std::thread thread_;
};

}  // namespace kstate::ingest
