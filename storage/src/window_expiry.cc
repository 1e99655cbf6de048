// Retention of windowed views: a compaction filter drops expired windows, and a
// background pass compacts the views whose windows expired since the last pass.

#include <rocksdb/options.h>

#include "db_impl.h"
#include "core/guard.h"
#include "core/value_codec.h"
#include "storage/key_codec.h"
#include "core/thread_name.h"

namespace kstate::storage {
namespace {

// Deletes the windows that were expired when the compaction started. The stored key is
// partition (4 bytes BE) ++ encode_windowed_key(key, start), whose last 8 bytes are the
// start, big-endian with the sign bit flipped (core/window.h). A removed entry becomes a
// deletion marker, so no older version of the window resurfaces from a lower level.
//
// A session's key holds its start, but it expires by its end: its value is a timed frame
// whose time is the session's last record time (core/value_codec.h), compared with the
// cutoff instead. A session value without a timed frame is kept.
class window_expiry_filter final : public rocksdb::CompactionFilter {
 public:
  window_expiry_filter(std::map<int32_t, int64_t> cutoffs, bool by_last, std::atomic<uint64_t>& expired)
      : cutoffs_(std::move(cutoffs)), by_last_(by_last), expired_(expired) {}

  bool Filter(int, const rocksdb::Slice& key, const rocksdb::Slice& value, std::string*, bool*) const override {
    constexpr size_t shortest = 4 + 2 + 8;  // partition, empty key's terminator, start
    if (key.size() < shortest) return false;
    const auto* b = reinterpret_cast<const unsigned char*>(key.data());
    auto partition = static_cast<int32_t>(uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | b[3]);
    auto it = cutoffs_.find(partition);
    if (it == cutoffs_.end()) return false;
    if (by_last_) {
      auto f = unframe_value(std::string_view(value.data(), value.size()));
      if (!f || !f->time || *f->time >= it->second) return false;
      expired_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    uint64_t u = 0;
    for (size_t j = key.size() - 8; j < key.size(); ++j) u = (u << 8) | b[j];
    auto start = static_cast<int64_t>(u ^ (uint64_t{1} << 63));
    if (start >= it->second) return false;
    expired_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  const char* Name() const override { return "kstate.window_expiry"; }

 private:
  std::map<int32_t, int64_t> cutoffs_;
  bool by_last_;
  std::atomic<uint64_t>& expired_;
};

class window_expiry_filter_factory final : public rocksdb::CompactionFilterFactory {
 public:
  explicit window_expiry_filter_factory(std::shared_ptr<window_expiry> state) : state_(std::move(state)) {}
  std::unique_ptr<rocksdb::CompactionFilter> CreateCompactionFilter(
      const rocksdb::CompactionFilter::Context&) override {
    return std::make_unique<window_expiry_filter>(state_->cutoffs(), state_->by_last(), state_->expired);
  }
  const char* Name() const override { return "kstate.window_expiry"; }

 private:
  std::shared_ptr<window_expiry> state_;
};

}  // namespace

std::shared_ptr<rocksdb::CompactionFilterFactory> make_window_expiry_filter_factory(
    std::shared_ptr<window_expiry> state) {
  return std::make_shared<window_expiry_filter_factory>(std::move(state));
}

status load_stream_times(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* meta, const std::string& store,
                         const std::string& position, std::map<int32_t, int64_t>& stream_time) {
  // Stream times as stored: "pos" 0x00 name 0x00 partition (4 bytes).
  auto prefix = encode_position_key(position, 0);
  prefix.resize(prefix.size() - 4);
  std::unique_ptr<rocksdb::Iterator> it(rdb.NewIterator(rocksdb::ReadOptions(), meta));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    auto k = it->key();
    if (k.size() != prefix.size() + 4) continue;
    auto part = decode_data_key(std::string_view(k.data() + prefix.size(), 4));
    auto t = decode_offset(std::string_view(it->value().data(), it->value().size()));
    if (part && t) stream_time[part->partition] = *t;
  }
  return from_rocks(it->status(), "reading stream times of '" + store + "'");
}

result<int> db::impl::expire() {
  std::lock_guard lock(expire_mu);
  int compacted = 0;
  for (auto& [view, state] : expiry) {
    auto now = state->cutoffs();
    bool advanced = false;
    for (const auto& [p, cutoff] : now) {
      auto it = state->compacted.find(p);
      if (it == state->compacted.end() || it->second < cutoff) advanced = true;
    }
    if (!advanced) continue;
    rocksdb::CompactRangeOptions o;
    o.exclusive_manual_compaction = false;  // automatic compactions go on meanwhile
    o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
    auto s = rdb->CompactRange(o, views.at(view), nullptr, nullptr);
    if (!s.ok()) return from_rocks(s, "compacting expired windows of '" + view_names.at(view) + "'");
    state->compacted = std::move(now);
    ++compacted;
  }
  return compacted;
}

void db::impl::start_expiry(std::chrono::milliseconds every) {
  expiry_thread = std::thread([this, every] {
    name_this_thread("ks-expiry");
    run_expiry(every);
  });
}

void db::impl::run_expiry(std::chrono::milliseconds every) {
  std::unique_lock lock(thread_mu);
  while (!thread_cv.wait_for(lock, every, [&] { return stopping; })) {
    lock.unlock();
    auto started = std::chrono::steady_clock::now();
    result<int> done = status::internal("not run");
    // The thread's last resort: whatever escapes a pass is that pass's failure, logged
    // below; the next pass runs as usual.
    if (auto why = guarded([&] { done = expire(); })) done = status::internal("exception: " + *why);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    lock.lock();
    if (stopping) break;
    if (!done.ok()) storage_log()->warn("expiring windows: {}", done.error().message());
    else if (*done > 0)
      storage_log()->info("expired windows: compacted {} windowed view(s) in {} ms", *done, ms.count());
  }
}

void db::impl::stop_expiry() {
  if (!expiry_thread.joinable()) return;
  {
    std::lock_guard lock(thread_mu);
    stopping = true;
  }
  thread_cv.notify_all();
  rdb->DisableManualCompaction();  // ends a running pass early
  expiry_thread.join();
}

result<int> db::expire_windows() { return impl_->expire(); }

}  // namespace kstate::storage
