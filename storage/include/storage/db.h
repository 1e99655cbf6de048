#pragma once
// storage::db: the RocksDB instance holding every view of one kstate process.
//
// One column family per view, one "__kstate_meta" column family for positions, one
// block cache shared by all of them. RocksDB types never appear in this header.
//
// Thread safety: db is safe for concurrent use: one writer (the ingest thread) and any
// number of readers (HTTP threads). write_batch is not thread-safe; each belongs to the
// thread that builds it.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/types.h"
#include "core/window.h"

namespace kstate::storage {

// Settings of one view's column family; each can be overridden per store.
struct store_options {
  // Memtable size, bytes. Default 16 MiB.
  uint64_t write_buffer_bytes = 16ull << 20;
  // Memtables before writes stall. Default 2.
  int max_write_buffers = 2;
  // Bloom filter bits per key (0 disables). Default 10 (~1% false positives).
  int bloom_bits_per_key = 10;
  // none | snappy | lz4 | zstd. Default lz4.
  std::string compression = "lz4";
  // level | universal. Default level.
  std::string compaction_style = "level";
};

// A windowed view (core/window.h). Its stored keys end in the window start
// (encode_windowed_key), and its partitions' stream times are the named position
// `stream_time_position` (write_batch::set_named_position). A compaction filter deletes
// every window expired at its partition's stream time, so retention also frees disk.
struct windowed_store {
  window_spec spec;
  std::string stream_time_position;
};

// A versioned table view: besides the latest value of each key (where plain reads find
// it), every version of it, by record timestamp, written with write_batch::put_version.
// Its partitions' stream times (largest record timestamp applied) are the named position
// `stream_time_position`. Versions valid at some time within `history_ms` of their
// partition's stream time are kept; a compaction filter deletes the older ones. The
// versions live in a column family of their own, "<view>#versions" (created at open,
// with the default store options), so the view's plain reads pay nothing for them.
struct versioned_store {
  int64_t history_ms = 0;  // > 0
  std::string stream_time_position;
};

struct db_options {
  // Directory holding the RocksDB files. Created (mode 0700) when missing.
  std::string path;
  // The memory budget: one LRU block cache shared by every view, bytes. Data blocks,
  // index and filter blocks and (through a WriteBufferManager) memtables are all
  // charged to it, so RocksDB's memory stays near this figure whatever the data size.
  // Default 64 MiB.
  uint64_t block_cache_bytes = 64ull << 20;
  // Part of the budget memtables of all views may use together before the largest is
  // flushed, bytes. 0: a quarter of block_cache_bytes. Default 0.
  uint64_t write_buffer_manager_bytes = 0;
  // Background flush + compaction threads. Default 2.
  int max_background_jobs = 2;
  // Defaults for every view, and per-view overrides by view name.
  store_options defaults;
  std::map<std::string, store_options> per_store;
  // Windowed views by view name.
  std::map<std::string, windowed_store> windowed;
  // Views whose keys expire, by view name: time to live, ms (> 0). Their values carry a
  // time (core/value_codec.h, timed frames). A value with time + ttl at or before the
  // clock is expired: no read returns it (db::get, and every read of a snapshot: get,
  // multi_get, scan, cursor), and a compaction filter deletes it. Values in plain frames
  // (no time) never expire. The view's files are compacted at least every
  // max(ttl, 1 h) (RocksDB's periodic compaction), so expired keys also leave the disk.
  std::map<std::string, int64_t> ttl_ms;
  // Versioned views by view name. Such a view cannot also have a ttl or be windowed.
  std::map<std::string, versioned_store> versioned;
  // The wall clock the time to live is measured by, ms since the epoch; empty: the
  // system clock. Called from any thread. Tests inject their own.
  std::function<int64_t()> clock;
  // How often a background thread compacts windowed views in which windows expired since
  // the last pass (db::expire_windows), ms; 0: expired windows leave disk only when RocksDB
  // compacts their files anyway. Default 1 h.
  int64_t window_expiry_interval_ms = 3'600'000;
  // How often a background thread checks that the files the database lives on (its SST
  // files, MANIFEST, CURRENT, OPTIONS and current write-ahead log) are still on disk, ms;
  // 0: never. A file deleted under a running instance keeps working while RocksDB holds
  // it open, and fails, or answers without its keys, once reopened: db::must_reopen()
  // then names it. Default 15 s.
  int64_t verify_files_interval_ms = 15'000;
};

// Identifies a view's column family; obtained once from db::view_id().
using view_id = uint32_t;

// One atomic write: state changes and the positions they reach, together. Nothing in
// it is visible until db::write() applies all of it at once.
class write_batch {
 public:
  ~write_batch();
  write_batch(write_batch&&) noexcept;
  write_batch& operator=(write_batch&&) noexcept;

  void put(view_id view, int32_t partition, std::string_view key, std::string_view value);
  // The same with the value given in two parts, stored as value_head ++ value_tail
  // (a frame and the record's bytes) without concatenating them first.
  void put(view_id view, int32_t partition, std::string_view key, std::string_view value_head,
           std::string_view value_tail);
  void del(view_id view, int32_t partition, std::string_view key);
  // A versioned view (db_options::versioned): the record at `offset` with `timestamp`
  // (ms) sets `key` to `value` (nullopt: a tombstone) from that time on. db::write()
  // places it among the key's versions, in the order put_version() was called: a
  // timestamp older than the latest version's becomes a version in the middle of the
  // history and leaves the latest value alone; an equal timestamp replaces that version.
  // A timestamp older than the partition's stream time minus the history is too late to
  // place: it is dropped and counted (view_stats::late_versions).
  void put_version(view_id view, int32_t partition, std::string_view key, int64_t timestamp, int64_t offset,
                   std::optional<std::string_view> value);
  // Records that after this batch the view's state reflects `partition` up to (but not
  // including) `next_offset`.
  void set_position(view_id view, int32_t partition, int64_t next_offset);

  // A position under its own name (e.g. "<view>#changelog": how far an aggregate's
  // changelog partition is reflected), written atomically with the rest of the batch.
  // Names of views never contain '#', so these never collide with view positions.
  void set_named_position(std::string_view name, int32_t partition, int64_t next_offset);

  // put, del and the position setters never throw: the first operation that cannot be
  // added (RocksDB refused it, or an unknown view id) is kept here, and db::write()
  // returns it without writing anything. clear() forgets it.
  const status& error() const;

  size_t operation_count() const;
  size_t byte_size() const;
  bool empty() const { return operation_count() == 0; }
  void clear();

  // What the batch holds, decoded from the underlying RocksDB batch (for tests and
  // diagnostics). `value` is nullopt for deletes; `position` is set for position records.
  // Versions (put_version) come last, each as a put (or delete) of its key, in the
  // order given, whatever db::write() will make of them.
  struct entry {
    view_id view;
    int32_t partition;
    std::string key;
    std::optional<std::string> value;
    std::optional<int64_t> position;
  };
  std::vector<entry> entries() const;

 private:
  friend class db;
  struct impl;
  explicit write_batch(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

// RocksDB's view of one column family (the properties Kafka Streams reports per store,
// KIP-471). A versioned view's byte figures include its versions' column family; its
// estimated keys are those of the latest values.
struct view_stats {
  uint64_t estimated_keys = 0;            // rocksdb.estimate-num-keys
  uint64_t live_sst_bytes = 0;            // rocksdb.live-sst-files-size
  uint64_t total_sst_bytes = 0;           // rocksdb.total-sst-files-size
  uint64_t memtable_bytes = 0;            // rocksdb.cur-size-all-mem-tables
  uint64_t pending_compaction_bytes = 0;  // rocksdb.estimate-pending-compaction-bytes
  uint64_t running_compactions = 0;       // rocksdb.num-running-compactions (whole DB)
  uint64_t running_flushes = 0;           // rocksdb.num-running-flushes (whole DB)
  uint64_t expired_windows = 0;           // windowed views: windows deleted by retention since open
  uint64_t expired_keys = 0;              // views with a ttl: expired keys deleted by compaction since open
  uint64_t expired_versions = 0;          // versioned views: versions deleted by compaction since open
  uint64_t late_versions = 0;             // versioned views: records dropped as too late to place since open
};

// Whole-database figures.
struct db_stats {
  uint64_t block_cache_capacity = 0;
  uint64_t block_cache_usage = 0;  // includes memtables charged to the cache
  uint64_t block_cache_pinned = 0;
  uint64_t block_cache_hits = 0;    // cumulative
  uint64_t block_cache_misses = 0;  // cumulative
  uint64_t write_stall_micros = 0;  // cumulative time writes were stalled
  uint64_t background_errors = 0;   // rocksdb.background-errors
  uint64_t bytes_written = 0;       // cumulative
  uint64_t bytes_read = 0;          // cumulative
};

struct get_result {
  std::optional<std::string> value;  // nullopt: key absent
  std::optional<int64_t> position;   // the partition's position, read at the same point
};

// One version of a key of a versioned view: its value from `valid_from` (inclusive,
// ms) until `valid_to` (exclusive).
struct version {
  int64_t valid_from = 0;
  std::optional<int64_t> valid_to;   // nullopt: still valid (the latest version)
  std::optional<std::string> value;  // the stored value, as get() returns it; nullopt: a tombstone
  int64_t offset = -1;               // offset of the record that wrote it (a tombstone's too)
};

// Iterates one partition's keys of one view within bounds, in key byte order (or its
// reverse). Keys and values are valid until the next call to next(). Not thread-safe.
class partition_iterator {
 public:
  virtual ~partition_iterator() = default;
  virtual bool valid() const = 0;
  virtual std::string_view key() const = 0;  // the record key, without the partition prefix
  virtual std::string_view value() const = 0;
  virtual void next() = 0;           // towards the end of the iteration order
  virtual status error() const = 0;  // non-ok when iteration stopped on an error
};

// One iterator moved from partition to partition of a view. A page needs a few keys of
// each of many partitions; seeking one iterator once per partition costs a fraction of
// creating an iterator per partition.
class partition_cursor : public partition_iterator {
 public:
  // Positions at the first key k of `partition` with lower <= k < upper in the cursor's
  // order (a missing bound is open); valid() is false when there is none.
  virtual void seek(int32_t partition, const std::optional<std::string>& lower,
                    const std::optional<std::string>& upper) = 0;
};

// How a scan uses the shared block cache. A page (a bounded read, such as one page of a
// range, likely read again) caches the blocks it reads. A sweep (a read of a whole store:
// an exact count, a streamed scan) does not, so it leaves the lookups' working set in
// the cache.
enum class scan_use { page, sweep };

// A consistent view of the database at one instant: every read through it (values,
// positions, iterators) sees the same state, whatever ingest writes meanwhile. Keys of
// views with a ttl (db_options::ttl_ms) are expired as of the clock when the snapshot
// was taken, for every read through it alike.
// Safe to share between threads; the snapshot is released with the last reference.
class snapshot {
 public:
  virtual ~snapshot() = default;
  virtual result<std::optional<int64_t>> position(view_id view, int32_t partition) const = 0;
  // The positions of many partitions in one read, in the order of `partitions`.
  virtual result<std::vector<std::optional<int64_t>>> positions(view_id view,
                                                                const std::vector<int32_t>& partitions) const = 0;
  virtual result<std::optional<std::string>> get(view_id view, int32_t partition, std::string_view key) const = 0;
  // One RocksDB MultiGet for many keys, each with its partition. Results in input order.
  virtual result<std::vector<std::optional<std::string>>> multi_get(
      view_id view, const std::vector<std::pair<int32_t, std::string>>& keys) const = 0;
  // Keys k of `partition` with lower <= k < upper (a missing bound is open), ascending,
  // or descending when `descending`.
  virtual std::unique_ptr<partition_iterator> scan(view_id view, int32_t partition, std::optional<std::string> lower,
                                                   std::optional<std::string> upper, bool descending,
                                                   scan_use use) const = 0;
  // A cursor over the partitions of `view`, ascending or descending; seek() it to each.
  virtual std::unique_ptr<partition_cursor> cursor(view_id view, bool descending, scan_use use) const = 0;
  // Every position of one partition of `view`: its own (named after the view) and its
  // named positions ("<view>#...", e.g. an aggregate's changelog position or a windowed
  // view's stream time), ordered by name. Empty when the partition holds no state.
  virtual result<std::vector<std::pair<std::string, int64_t>>> view_positions(view_id view,
                                                                              int32_t partition) const = 0;

  // --- versioned views (db_options::versioned) ---
  // The earliest time the partition's history answers for: its stream time minus the
  // history; nullopt when no version was written to it yet. Versions valid only before
  // it may still be on disk (compaction deletes them later); the readers below never
  // return them when given a time at or after it.
  virtual result<std::optional<int64_t>> history_start(view_id view, int32_t partition) const = 0;
  // The version of `key` valid at `time`, tombstones included; nullopt when none was.
  virtual result<std::optional<version>> version_at(view_id view, int32_t partition, std::string_view key,
                                                    int64_t time) const = 0;
  // The versions of `key` valid at some time in [from, to) and not ending at or before
  // `not_before`, newest first, at most `limit` of them.
  virtual result<std::vector<version>> versions(view_id view, int32_t partition, std::string_view key, int64_t from,
                                                int64_t to, int64_t not_before, size_t limit) const = 0;
  // A cursor over the keys that had a value at `time` (a tombstone then: skipped), each
  // with that value, in key order; seek() it to each partition as cursor() is.
  virtual std::unique_ptr<partition_cursor> cursor_as_of(view_id view, int64_t time, bool descending,
                                                         scan_use use) const = 0;
  // The stored versions of one partition, raw, in stored order (for copies:
  // partition_loader::add_version).
  virtual std::unique_ptr<partition_iterator> scan_versions(view_id view, int32_t partition) const = 0;
};

// Installs one partition of one view from a copy made elsewhere (a snapshot of another
// instance's store, DESIGN.md invariant 8). add() the entries in ascending key order,
// as a partition_iterator gives them (record key without the partition, stored value),
// then commit() with the positions they reflect. Nothing of the partition changes until
// commit(); commit() replaces the partition's data and positions: first the old ones are
// deleted (one atomic write: a crash right after leaves the partition without a position,
// so ingest rebuilds it from the beginning), then the new data and positions arrive
// together in one atomic ingestion of SST files. A loader destroyed before commit()
// leaves no trace. Not thread-safe; the caller must keep every writer off the partition
// (it is not assigned to this instance yet) until commit() returns.
class partition_loader {
 public:
  virtual ~partition_loader() = default;
  // Adds one entry; keys must ascend strictly (in byte order). Fails on disk errors and
  // on a key out of order.
  virtual status add(std::string_view key, std::string_view value) = 0;
  // A versioned view's stored version, as snapshot::scan_versions() gives it; after
  // every add(), in ascending order.
  virtual status add_version(std::string_view key, std::string_view value) = 0;
  // An entry of companion `i` (db::load_partition's `companions`), as a
  // partition_iterator of that view gives it; each companion's keys ascend strictly.
  // invalid_argument when there is no companion `i`.
  virtual status add_companion(size_t i, std::string_view key, std::string_view value) = 0;
  // Installs what was added with `positions`: (name, next offset) pairs, each named
  // after the view or "<view>#...". At least the view's own position is required.
  virtual status commit(const std::vector<std::pair<std::string, int64_t>>& positions) = 0;
  virtual uint64_t entries() const = 0;
  // Bytes of keys and values added.
  virtual uint64_t bytes() const = 0;
};

class db {
 public:
  // Opens (or creates) the database with a column family for each view. Column
  // families of views no longer configured are kept (opened, unused), never dropped.
  //
  // A database RocksDB refuses to open because it is damaged (a file it lists is
  // missing, or corrupt) is moved aside, never deleted: its files go to
  // `quarantine/<UTC time>/` under the state directory, and an empty database is
  // created in its place, keeping the instance identity when it can still be read.
  // Every partition then has no position, so each view is rebuilt from Kafka (its
  // source topic, or its changelog) or copied from another instance. `quarantined()`
  // says so. A state directory that refuses writes (read-only, full) is an io_error
  // saying so; nothing is moved then.
  static result<std::unique_ptr<db>> open(const db_options& opts, const std::vector<std::string>& views);
  ~db();
  db(const db&) = delete;
  db& operator=(const db&) = delete;

  // The id of a configured view, or nullopt.
  std::optional<view_id> find_view(std::string_view name) const;
  const std::string& view_name(view_id id) const;

  // An empty batch bound to this database.
  write_batch new_batch() const;

  // Applies the batch atomically, WAL on. After it returns, a process crash (kill -9)
  // keeps the whole batch; a crash before it keeps none of it.
  status write(write_batch& batch);
  // After a failed write (disk full, read-only directory), RocksDB refuses writes until
  // it recovers: this asks it to (flushing what it holds). ok when writes work again.
  // Some failures stop RocksDB for good (a write-ahead log it could not create): its
  // recovery then fails with the same error whatever the directory does now. When it
  // fails three times in a row while the directory takes writes again, must_reopen()
  // says so. Called by one thread at a time.
  status resume();

  // The stored position of a view's partition: the next offset to consume, or nullopt
  // when the partition has never been applied.
  result<std::optional<int64_t>> stored_position(view_id view, int32_t partition) const;

  // A position written with write_batch::set_named_position, or nullopt.
  result<std::optional<int64_t>> stored_named_position(std::string_view name, int32_t partition) const;

  // The identity of the instance that owns this state directory: a random id (16 hex
  // digits) created on first use and kept with the state, so a restarted instance finds
  // the same one (its transactional.id and group.instance.id derive from it: a restart
  // fences its previous incarnation and takes its partitions back).
  //
  // `where` describes where the directory lives (host, path, file system identity: the
  // caller's fingerprint), and is kept with the id. When it differs from the stored one,
  // the directory was copied or moved (a replaced host, a restored backup, two
  // instances started from copies of one directory): a new id is made, so that two
  // instances never share one. `renewed` says so.
  struct identity {
    std::string id;
    bool renewed = false;  // a new id, because `where` changed
    bool created = false;  // the first id of this directory
  };
  result<identity> instance_id(std::string_view where);

  // Value and position read from one snapshot, so the position describes the value.
  result<get_result> get(view_id view, int32_t partition, std::string_view key) const;
  // How many get() calls read the value alone and answered the position kept in memory
  // (no write moved it meanwhile), and snapshots whose positions came from memory; the
  // others read them from RocksDB. For tests.
  uint64_t cached_position_reads() const;

  // A consistent read view of everything, taken now.
  std::shared_ptr<const snapshot> read_snapshot() const;
  // The same, for a read that will ask the positions of `partitions` of `view`: when no
  // write moved any of them while the snapshot was taken, they are answered from the
  // positions kept in memory (as get() does) instead of a read of the meta column family.
  std::shared_ptr<const snapshot> read_snapshot(view_id view, const std::vector<int32_t>& partitions) const;

  // A loader that replaces one partition of `view` with entries and positions copied
  // from elsewhere (see partition_loader). Its files are written under the state
  // directory, in `bootstrap/`, and moved into the database on commit. The same
  // partition of each of `companions` (views whose state belongs to `view`'s, e.g. a join
  // view's sides, which have no positions of their own) is replaced in the same commit:
  // cleared, and installed from what add_companion() gave, nothing when it gave nothing.
  result<std::unique_ptr<partition_loader>> load_partition(view_id view, int32_t partition,
                                                           const std::vector<view_id>& companions = {});

  result<view_stats> stats(view_id view) const;
  db_stats stats() const;
  // "major.minor.patch" of the linked RocksDB.
  static std::string rocksdb_version();

  // Windowed views: compacts every windowed view in which some partition's stream time
  // expired windows since the last call, so the compaction filter deletes them from disk.
  // Returns how many views were compacted. Blocks until done; the background thread of
  // db_options::window_expiry_interval_ms calls it too.
  result<int> expire_windows();

  // Compacts the whole column family of a view now (and a versioned view's versions),
  // down to its last level: its compaction filters run over every file (expired keys of
  // a view with a ttl, expired windows, versions that left the history, leave the disk).
  // Blocks until done.
  status compact(view_id view);

  // Flushes memtables (used on clean shutdown so restart replays no WAL).
  status flush();

  // Checks once that every live file of the database is still on disk (what the
  // background check of db_options::verify_files_interval_ms does). ok, or corruption
  // naming the missing file; a failure is also kept as must_reopen().
  status verify_files();
  // Why this database must be closed and opened again; empty while it can go on. Either
  // a live file was deleted under it (verify_files(): reads still work while RocksDB
  // holds the file open, but the next open would miss it, so the open rebuilds), or
  // RocksDB stopped on an error only a reopen clears (resume()). Any thread. The caller
  // stops serving from it and reopens.
  std::string must_reopen() const;
  // Where open() moved a damaged database (quarantine/<time>/), and why; empty when it
  // opened the database as it was.
  struct quarantine_info {
    std::string path;
    std::string reason;
  };
  const std::optional<quarantine_info>& quarantined() const;

 private:
  friend class write_batch;
  struct impl;
  explicit db(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

}  // namespace kstate::storage
