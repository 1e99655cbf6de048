#include "api/workers.h"
#include "log.h"
#include "core/thread_name.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>

namespace kstate::server::api {

worker_pool::worker_pool(int threads, std::size_t max_queued) : q_(std::make_shared<queue>(max_queued)) {
  threads_.reserve(static_cast<std::size_t>(std::max(1, threads)));
  for (int i = 0; i < std::max(1, threads); ++i)
    threads_.emplace_back([q = q_] {
      name_this_thread("ks-worker");
      run(q);
    });
}

worker_pool::~worker_pool() {
  {
    std::lock_guard lock(q_->mu);
    q_->stopping = true;
  }
  q_->cv.notify_all();
  for (auto& t : threads_) {
    if (t.get_id() == std::this_thread::get_id()) t.detach();  // returns from run() once the queue is empty
    else t.join();
  }
}

bool worker_pool::post(std::function<void()> task) {
  {
    std::lock_guard lock(q_->mu);
    if (q_->stopping || q_->tasks.size() >= q_->max_queued) return false;
    q_->tasks.push_back(std::move(task));
  }
  q_->cv.notify_one();
  return true;
}

std::size_t worker_pool::queued() const {
  std::lock_guard lock(q_->mu);
  return q_->tasks.size();
}

void worker_pool::run(std::shared_ptr<queue> q) {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(q->mu);
      q->cv.wait(lock, [&] { return q->stopping || !q->tasks.empty(); });
      if (q->tasks.empty()) return;  // stopping, and everything queued has run
      task = std::move(q->tasks.front());
      q->tasks.pop_front();
    }
    // Tasks answer their own requests; one that throws is a bug, and must not take the
    // pool's thread (and every later task) with it.
    try {
      task();
    } catch (const std::exception& e) {
      server_log()->error("api worker: a task threw: {}", e.what());
    } catch (...) {
      server_log()->error("api worker: a task threw a non-std exception");
    }
    // The task (and what it holds: perhaps the last reference to the pool's owner) is
    // released here, before the next wait.
    task = nullptr;
  }
}

}  // namespace kstate::server::api
