// Time to live of table views: the read-side test every reader applies, and the
// compaction filter that deletes expired keys from disk.

#include "core/value_codec.h"
#include "db_impl.h"

namespace kstate::storage {

bool value_expired(std::string_view stored, int64_t ttl_ms, int64_t now) noexcept {
  if (ttl_ms <= 0) return false;
  auto f = unframe_value(stored);
  return f && f->time && ttl_expired(*f->time, ttl_ms, now);
}

namespace {

// Deletes the values expired when the compaction started. A removed entry becomes a
// deletion marker (as for expired windows), so no older version of the key resurfaces
// from a lower level (the expired value superseded it).
class ttl_filter final : public rocksdb::CompactionFilter {
 public:
  ttl_filter(int64_t ttl_ms, int64_t now, std::atomic<uint64_t>& expired)
      : ttl_ms_(ttl_ms), now_(now), expired_(expired) {}

  bool Filter(int, const rocksdb::Slice&, const rocksdb::Slice& value, std::string*, bool*) const override {
    if (!value_expired(std::string_view(value.data(), value.size()), ttl_ms_, now_)) return false;
    expired_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  const char* Name() const override { return "kstate.ttl"; }

 private:
  int64_t ttl_ms_;
  int64_t now_;
  std::atomic<uint64_t>& expired_;
};

class ttl_filter_factory final : public rocksdb::CompactionFilterFactory {
 public:
  explicit ttl_filter_factory(std::shared_ptr<ttl_state> state) : state_(std::move(state)) {}
  std::unique_ptr<rocksdb::CompactionFilter> CreateCompactionFilter(
      const rocksdb::CompactionFilter::Context&) override {
    return std::make_unique<ttl_filter>(state_->ttl_ms, state_->clock(), state_->expired);
  }
  const char* Name() const override { return "kstate.ttl"; }

 private:
  std::shared_ptr<ttl_state> state_;
};

}  // namespace

std::shared_ptr<rocksdb::CompactionFilterFactory> make_ttl_filter_factory(std::shared_ptr<ttl_state> state) {
  return std::make_shared<ttl_filter_factory>(std::move(state));
}

status db::compact(view_id view) {
  if (view >= impl_->views.size()) return status::invalid_argument("unknown view id " + std::to_string(view));
  rocksdb::CompactRangeOptions o;
  o.exclusive_manual_compaction = false;  // automatic compactions go on meanwhile
  o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
  auto s = from_rocks(impl_->rdb->CompactRange(o, impl_->views[view], nullptr, nullptr),
                      "compacting '" + impl_->view_names[view] + "'");
  // A versioned view's versions too: their compaction filter deletes those that left
  // the history.
  if (auto v = impl_->versioned.find(view); s.ok() && v != impl_->versioned.end())
    s = from_rocks(impl_->rdb->CompactRange(o, v->second->cf, nullptr, nullptr),
                   "compacting the versions of '" + impl_->view_names[view] + "'");
  return s;
}

}  // namespace kstate::storage
