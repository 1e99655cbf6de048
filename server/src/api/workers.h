#pragma once
// worker_pool: the threads that run the API's blocking work, so that none of it runs
// on an HTTP I/O thread: exact counts (a scan of the store), pages of windows (which may
// skip over many stored windows), NDJSON scan pieces, reads resumed after a
// min_position wait, and the merge of gathered parts.
//
// Bounded twice: `threads` threads, and at most `max_queued` tasks waiting. A post()
// beyond that is refused at once (the caller answers 503), so a burst of expensive
// requests cannot queue unbounded work or memory.
//
// Thread safety: post() from any thread. The destructor stops accepting work, runs what
// is already queued, and joins the threads. It may run on one of the pool's own threads
// (a task held the last reference to the pool's owner): that thread is then left to
// finish on its own, on the queue it shares with the others, which outlives the pool.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kstate::server::api {

class worker_pool {
 public:
  worker_pool(int threads, std::size_t max_queued);
  ~worker_pool();
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  // Queues `task`; false (and `task` dropped) when max_queued tasks are waiting or the
  // pool is stopping. A task must not throw: what escapes is logged and dropped.
  [[nodiscard]] bool post(std::function<void()> task);
  // Tasks waiting (not running), for metrics.
  std::size_t queued() const;

 private:
  // What the threads share, kept alive by each of them.
  struct queue {
    explicit queue(std::size_t max) : max_queued(max) {}
    const std::size_t max_queued;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> tasks;  // guarded by mu
    bool stopping = false;                    // guarded by mu
  };
  static void run(std::shared_ptr<queue> q);

  std::shared_ptr<queue> q_;
  std::vector<std::thread> threads_;
};

}  // namespace kstate::server::api
