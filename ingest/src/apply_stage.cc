#include "apply_stage.h"

#include "core/guard.h"
#include "kafka_common.h"
#include "core/thread_name.h"

namespace kstate::ingest {

namespace {
// The most cleared batches kept for reuse: enough for the queue's turnover, few enough
// that their buffers do not hold much memory when ingest is idle.
constexpr std::size_t max_spare = 4;
}  // namespace

apply_stage::apply_stage(apply_fn apply, std::size_t max_queued_bytes)
    : apply_(std::move(apply)), max_bytes_(max_queued_bytes) {
  thread_ = std::thread([this] {
    name_this_thread("ks-writer");
    if (auto why = guarded([this] { run(); })) {
      log()->critical("ingest apply thread stopped by an exception: {}", *why);
      std::lock_guard lock(mu_);
      failed_ = true;
      queue_.clear();
      queued_bytes_ = 0;
      pending_bytes_ = 0;
      busy_ = false;
      idle_cv_.notify_all();
      room_cv_.notify_all();
    }
  });
}

apply_stage::~apply_stage() { stop(); }

bool apply_stage::submit(built_batch b) {
  std::lock_guard lock(mu_);
  if (failed_ || stopping_) return false;
  queued_bytes_ += b.bytes();
  pending_bytes_ += b.bytes();
  queue_.push_back(std::move(b));
  work_cv_.notify_one();
  return true;
}

bool apply_stage::drain() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return failed_ || (queue_.empty() && !busy_); });
  return !failed_;
}

void apply_stage::wait_for_room(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  room_cv_.wait_for(lock, timeout, [&] { return failed_ || queued_bytes_ < max_bytes_; });
}

std::optional<storage::write_batch> apply_stage::recycled() {
  std::lock_guard lock(mu_);
  if (spare_.empty()) return std::nullopt;
  auto b = std::move(spare_.back());
  spare_.pop_back();
  return b;
}

bool apply_stage::failed() const {
  std::lock_guard lock(mu_);
  return failed_;
}

void apply_stage::stop() {
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void apply_stage::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything submitted was applied
    built_batch b = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= b.bytes();
    busy_ = true;
    lock.unlock();
    const bool ok = apply_(b);  // nothing is queued once the stage failed
    const std::size_t bytes = b.bytes();
    b.batch.clear();
    lock.lock();
    busy_ = false;
    pending_bytes_ -= bytes;
    if (!ok) {
      failed_ = true;
      queue_.clear();
      queued_bytes_ = 0;
      pending_bytes_ = 0;
    } else if (spare_.size() < max_spare) {
      spare_.push_back(std::move(b.batch));
    }
    room_cv_.notify_all();
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace kstate::ingest
