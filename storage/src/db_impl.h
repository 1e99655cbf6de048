#pragma once
// Internals of storage::db shared by its files: db.cc (open, write, point reads,
// stats), window_expiry.cc (retention of windowed views) and snapshot.cc (snapshots
// and their iterators). RocksDB types appear here, never in include/storage/.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <rocksdb/cache.h>
#include <rocksdb/compaction_filter.h>
#include <rocksdb/db.h>
#include <rocksdb/statistics.h>
#include <spdlog/logger.h>

#include "core/status.h"
#include "core/window.h"
#include "position_cache.h"
#include "storage/db.h"
#include "versions.h"

namespace kstate::storage {

// Converts a RocksDB status at the module edge.
status from_rocks(const rocksdb::Status& s, std::string_view what);

// The module's named logger.
std::shared_ptr<spdlog::logger> storage_log();

// Retention of one windowed view: each partition's stream time as last written, and the
// windows the compaction filter deleted.
struct window_expiry {
  window_spec spec;
  std::atomic<uint64_t> expired{0};
  mutable std::mutex mu;
  std::map<int32_t, int64_t> stream_time;  // guarded by mu
  // First live start per partition when db::expire_windows last compacted the view.
  // Only touched under db::impl::expire_mu.
  std::map<int32_t, int64_t> compacted;

  // Per partition with a stream time: windows starting before this are expired;
  // sessions (by_last()), those whose last record time is before it.
  std::map<int32_t, int64_t> cutoffs() const {
    std::map<int32_t, int64_t> out;
    std::lock_guard lock(mu);
    for (const auto& [p, t] : stream_time)
      if (t >= 0) out.emplace(p, by_last() ? first_live_last(spec, t) : first_live_start(spec, t));
    return out;
  }
  // Sessions expire by their end, which their value's frame holds (the timed frame's
  // time: the last record time), not by the start in their key.
  bool by_last() const noexcept { return is_session(spec); }
};

// The compaction filter factory of a windowed view's column family: every compaction
// deletes the windows expired at the stream times `state` holds when it starts.
std::shared_ptr<rocksdb::CompactionFilterFactory> make_window_expiry_filter_factory(
    std::shared_ptr<window_expiry> state);

// A view whose keys expire (db_options::ttl_ms): its time to live and the expired keys
// its compaction filter deleted.
struct ttl_state {
  int64_t ttl_ms = 0;
  std::function<int64_t()> clock;
  std::atomic<uint64_t> expired{0};
};

// The compaction filter factory of a view with a ttl: every compaction deletes the
// values expired at the clock when it starts.
std::shared_ptr<rocksdb::CompactionFilterFactory> make_ttl_filter_factory(std::shared_ptr<ttl_state> state);

// Whether a stored value of a view with time to live `ttl_ms` (0: none) is expired at
// `now`. A value without a time, or too short for its frame (reported by the reader that
// decodes it), is not.
bool value_expired(std::string_view stored, int64_t ttl_ms, int64_t now) noexcept;

// Reads the stream times of windowed or versioned view `store`, stored under the named
// position `position`, into `stream_time` (by partition).
status load_stream_times(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* meta, const std::string& store,
                         const std::string& position, std::map<int32_t, int64_t>& stream_time);

// Every position of one partition of view `view` (its own and "<view>#..."), as read
// through `ro`, ordered by name.
result<std::vector<std::pair<std::string, int64_t>>> read_view_positions(rocksdb::DB& rdb,
                                                                         rocksdb::ColumnFamilyHandle* meta,
                                                                         const rocksdb::ReadOptions& ro,
                                                                         std::string_view view, int32_t partition);

struct db::impl {
  std::shared_ptr<rocksdb::Statistics> statistics;
  // Every view's stored positions, for lookups that read the value alone (db::get).
  // Each write of a view's position goes through db::write or a partition load, which
  // publish it here.
  std::unique_ptr<position_cache> positions;
  // Lookups answered with the cached position (for tests and stats).
  mutable std::atomic<uint64_t> cached_position_reads{0};
  std::unique_ptr<rocksdb::DB> rdb;
  std::shared_ptr<rocksdb::Cache> cache;
  rocksdb::ColumnFamilyHandle* meta = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // every opened column family
  std::vector<rocksdb::ColumnFamilyHandle*> views;    // indexed by view_id
  std::vector<std::string> view_names;                // indexed by view_id
  std::map<uint32_t, view_id> by_cf_id;               // column family id -> view_id
  std::map<std::string, view_id, std::less<>> by_name;
  // Views with a ttl, by view id; ttl_ms has one entry per view id (0: no ttl).
  std::map<view_id, std::shared_ptr<ttl_state>> ttl;
  std::vector<int64_t> ttl_ms;
  std::function<int64_t()> clock;  // never empty

  // Versioned views by view id, and by the name of their stream-time position.
  std::map<view_id, std::shared_ptr<versioned_state>> versioned;
  std::map<std::string, versioned_state*, std::less<>> versioned_by_position;

  // Windowed views: retention state by view, and by the name of their stream-time position.
  std::map<view_id, std::shared_ptr<window_expiry>> expiry;
  std::map<std::string, window_expiry*, std::less<>> expiry_by_position;
  std::mutex expire_mu;  // one expiry pass at a time
  std::thread expiry_thread;
  std::mutex thread_mu;
  std::condition_variable thread_cv;
  bool stopping = false;  // guarded by thread_mu

  // Defined in window_expiry.cc.
  // Compacts the windowed views whose cutoffs advanced since their last pass; returns
  // how many it compacted.
  result<int> expire();
  // Starts the background thread that calls expire() every `every`.
  void start_expiry(std::chrono::milliseconds every);
  // Stops and joins that thread, ending a running pass early; no-op when not started.
  void stop_expiry();

  // Live-file checks (defined in verify_files.cc).
  std::string path;
  std::optional<quarantine_info> quarantined;
  mutable std::mutex damage_mu;
  std::string damage;  // guarded by damage_mu; empty while healthy
  // db::resume(): failures in a row while the directory took writes.
  std::atomic<int> unrecovered{0};
  std::thread verify_thread;
  // Checks that every live file is on disk; corruption naming a missing one. One check
  // at a time (verify_mu).
  status verify_files();
  std::mutex verify_mu;
  std::map<uint64_t, std::string> known_logs;  // write-ahead logs seen on disk; under verify_mu
  // Adds the write-ahead logs RocksDB still needs that were deleted to `missing`.
  void missing_logs(std::vector<std::string>& missing);
  // Starts the background thread that calls verify_files() every `every`, until the
  // first damage it finds.
  void start_verify(std::chrono::milliseconds every);
  // Stops and joins that thread; no-op when not started. Shares thread_mu/thread_cv/
  // stopping with the expiry thread.
  void stop_verify();

  ~impl();

 private:
  void run_expiry(std::chrono::milliseconds every);
};

}  // namespace kstate::storage
