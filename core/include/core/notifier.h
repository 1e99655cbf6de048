#pragma once
// change_notifier: ingest announces "state moved" after each write; readers waiting for
// a position (read-your-writes) subscribe. Callbacks run on the notifying thread and
// must be quick (e.g. wake a condition variable).
//
// A callback that throws does not keep the others from hearing of the change: notify()
// calls every one, then rethrows the first exception to the notifying thread, whose
// guard reports it.
//
// Thread safety: all members may be called from any thread.

#include <exception>
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
    std::exception_ptr first;
    {
      std::lock_guard lock(mu_);
      for (const auto& cb : subscribers_) {
        try {
          cb();
        } catch (...) {
          if (!first) first = std::current_exception();
        }
      }
    }
    if (first) std::rethrow_exception(first);
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::function<void()>> subscribers_;
};

}  // namespace kstate
