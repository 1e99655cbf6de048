#include "changes.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/guard.h"
#include "core/thread_name.h"

namespace kstate::embed {

subscription::impl::impl(std::string s, std::function<void(const change&)> cb, std::size_t max)
    : store(std::move(s)), on_change(std::move(cb)), max_queued(std::max<std::size_t>(1, max)) {
  thread_ = std::thread([this] {
    name_this_thread("ks-listener");
    run();
  });
}

subscription::impl::~impl() { cancel(); }

void subscription::impl::push(std::vector<change>& changes) {
  std::unique_lock lock(mu_);
  for (auto& c : changes) {
    not_full_.wait(lock, [&] { return closing_ || queue_.size() < max_queued; });
    if (closing_) return;
    queue_.push_back(std::move(c));
    not_empty_.notify_one();
  }
}

void subscription::impl::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    not_empty_.wait(lock, [&] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) return;  // cancelled, and everything queued was delivered
    change c = std::move(queue_.front());
    queue_.pop_front();
    not_full_.notify_all();
    lock.unlock();
    // The application's code: what it throws is its own bug, said and survived.
    if (auto why = guarded([&] { on_change(c); }))
      spdlog::error("change listener of store '{}' threw: {}", store, *why);
    delivered.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
  }
}

void subscription::impl::cancel() {
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  not_empty_.notify_all();
  not_full_.notify_all();
  std::call_once(joined_, [this] {
    if (thread_.joinable()) thread_.join();
    if (on_cancel) on_cancel();
  });
}

bool subscription::impl::cancelled() const {
  std::lock_guard lock(mu_);
  return closing_;
}

subscription::subscription() = default;
subscription::subscription(std::shared_ptr<impl> i) : impl_(std::move(i)) {}
subscription::~subscription() { cancel(); }
subscription::subscription(subscription&&) noexcept = default;
subscription& subscription::operator=(subscription&& other) noexcept {
  if (this != &other) {
    cancel();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
void subscription::cancel() {
  if (impl_) impl_->cancel();
}
uint64_t subscription::delivered() const { return impl_ ? impl_->delivered.load() : 0; }

namespace detail {

bool change_hub::observes(std::string_view view) const {
  std::shared_lock lock(mu_);
  return std::any_of(subs_.begin(), subs_.end(), [&](const auto& s) { return s->store == view; });
}

void change_hub::applied(std::vector<ingest::applied_change> changes) {
  std::vector<std::shared_ptr<subscription::impl>> subs;
  {
    std::shared_lock lock(mu_);
    subs = subs_;
  }
  for (const auto& s : subs) {
    std::vector<change> mine;
    for (const auto& c : changes) {
      if (c.view != s->store) continue;
      mine.push_back(
          change{c.view, c.partition, c.key, c.window_start, c.old_value, c.new_value, c.offset, c.next_offset});
    }
    if (!mine.empty()) s->push(mine);
  }
}

void change_hub::add(std::shared_ptr<subscription::impl> s) {
  std::unique_lock lock(mu_);
  subs_.push_back(std::move(s));
  count_ = subs_.size();
}

void change_hub::remove(const subscription::impl* s) {
  std::unique_lock lock(mu_);
  subs_.erase(std::remove_if(subs_.begin(), subs_.end(), [&](const auto& x) { return x.get() == s; }), subs_.end());
  count_ = subs_.size();
}

std::vector<std::shared_ptr<subscription::impl>> change_hub::all() const {
  std::shared_lock lock(mu_);
  return subs_;
}

}  // namespace detail
}  // namespace kstate::embed
