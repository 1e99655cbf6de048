#pragma once
// change_notifier: ingest announces "state moved" after each write; readers waiting for
// a position (read-your-writes) subscribe. Callbacks run on the notifying thread and
// must be quick (e.g. wake a condition variable).
//
// Thread safety: all members may be called from any thread.

#include <functional>
#include <mutex>
#include <vector>

namespace kstate {

class change_notifier {
 public:
  void subscribe(std::function<void()> cb) {
    std::lock_guard lock(mu_);
    subscribers_.push_back(std::move(cb));
  }
  void notify() const {
    std::lock_guard lock(mu_);
    for (const auto& cb : subscribers_) cb();
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::function<void()>> subscribers_;
};

}  // namespace kstate
