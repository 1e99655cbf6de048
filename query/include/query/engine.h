#pragma once
// query::engine: answers queries over the local stores, in the vocabulary of Kafka
// Streams' Interactive Queries v2 (key_query, query_result, failure_reason, position).
// It knows nothing of HTTP; server/ translates requests to these calls.
//
// Thread safety: every member is safe to call concurrently from the HTTP threads.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/ownership.h"
#include "core/types.h"
#include "core/view.h"
#include "storage/db.h"

namespace kstate::query {

enum class failure_reason {
  unknown_query_store,  // no store of that name
  not_active,           // the key's partition is not assigned to this instance
  not_up_to_date,       // assigned here but still catching up (restoring)
  store_exception,      // storage failed
  // A versioned store asked as of a time before the history it keeps (its partition's
  // stream time minus the history): the answer is unknown, not absent. Don't retry.
  history_unavailable,
  // The answer needs a scan of more keys than the caller allows (count as of a time
  // over a store beyond its exact count limit). Don't retry.
  too_many_keys,
};

const char* to_string(failure_reason r) noexcept;

struct key_query {
  std::string store;
  std::string key;  // serialized key bytes, exactly as producers wrote them
  // The key's partition when the caller located it already (locate()); else computed.
  std::optional<int32_t> partition;
  // Versioned stores: the value valid at this time (ms since the epoch) rather than the
  // latest.
  std::optional<int64_t> as_of;
};

struct key_answer {
  std::optional<std::string> value;  // nullopt: absent; else the record's value bytes
  int64_t offset = -1;               // offset of the record that wrote the value
  int32_t partition = -1;
  position pos;  // the key's partition -> next offset reflected
  // key_query::as_of answers: the version's validity, [valid_from, valid_to), when one
  // was valid (valid_to nullopt: still valid). A tombstone valid then answers absent
  // with its validity.
  std::optional<int64_t> valid_from, valid_to;
};

// The answer to a query, or why there is none. Never both, never neither.
template <typename T>
class [[nodiscard]] query_result {
 public:
  static query_result success(T a) { return query_result(std::move(a)); }
  static query_result fail(failure_reason r, std::string m) { return query_result(failed{r, std::move(m)}); }

  bool ok() const noexcept { return v_.index() == 0; }
  // Preconditions: ok() for answer(), !ok() for failure() and message().
  const T& answer() const& { return std::get<0>(v_); }
  T& answer() & { return std::get<0>(v_); }
  T&& answer() && { return std::get<0>(std::move(v_)); }
  failure_reason failure() const { return std::get<1>(v_).reason; }
  const std::string& message() const { return std::get<1>(v_).message; }

  // The same failure as an answer of another type.
  template <typename U>
  query_result<U> as() const {
    return query_result<U>::fail(failure(), message());
  }

 private:
  struct failed {
    failure_reason reason;
    std::string message;
  };
  explicit query_result(T a) : v_(std::in_place_index<0>, std::move(a)) {}
  explicit query_result(failed f) : v_(std::in_place_index<1>, std::move(f)) {}
  std::variant<T, failed> v_;
};

// A range of keys, in serialized byte order across all partitions of the store.
struct range_query {
  std::string store;
  std::optional<std::string> from;    // inclusive lower bound
  std::optional<std::string> to;      // exclusive upper bound
  std::optional<std::string> prefix;  // keys starting with these bytes (combined with from/to)
  bool descending = false;
  std::optional<std::string> after;  // resume strictly after this key, in iteration order
  // Only these partitions (a scatter-gather part); nullopt: every partition of the topic.
  std::optional<std::vector<int32_t>> partitions;
  // For allow_stale pages (range() only): a partition not held current here is read
  // from this instance's copy of it (a former owner's, a standby's, or its own while it
  // catches up), failing not_active when there is none.
  bool from_copies = false;
  // Versioned stores: the keys and values as they were at this time (ms since the epoch).
  std::optional<int64_t> as_of;
};

struct range_entry {
  std::string key;    // serialized key bytes
  std::string value;  // the record's value bytes
  int64_t offset;     // offset of the record that wrote it
  int32_t partition;
  std::optional<int64_t> time;  // the value's time, when its frame has one (core/value_codec.h)
};

// Reads a range lazily from one snapshot: a k-way merge of per-partition iterators,
// each bounded to the range. Holds the snapshot (and so old data) while alive, so
// callers keep it short-lived. Not thread-safe; one reader at a time.
class range_stream {
 public:
  virtual ~range_stream() = default;
  // Appends up to `max` entries to `out`; false once the range is exhausted.
  virtual bool next(std::vector<range_entry>& out, size_t max) = 0;
  // Positions of every partition the range covers, as of the snapshot.
  virtual const position& pos() const = 0;
  virtual status error() const = 0;
};

struct range_answer {
  std::vector<range_entry> entries;
  bool more = false;  // entries beyond the limit exist
  position pos;
  bool stale = false;  // some partition was read from a copy (range_query::from_copies)
};

struct count_answer {
  uint64_t count = 0;
  bool exact = false;
  position pos;
};

struct batch_entry {
  std::string key;
  std::optional<std::string> value;
  int64_t offset = -1;
  int32_t partition = -1;
};

struct batch_answer {
  std::vector<batch_entry> entries;  // in request order
  position pos;                      // every partition touched
};

// The windows of one key of a windowed store overlapping [from, to) (event time, ms):
// every window with start < to and end > from, ordered by start. A session's end is
// its last record time + 1 (core/window.h).
struct window_query {
  std::string store;
  std::string key;                   // serialized group key bytes
  std::optional<int32_t> partition;  // the key's partition, when the caller located it
  int64_t from = 0;
  int64_t to = 0;
  // Stops reading once the windows' values hold more than this many bytes; the answer
  // then says `truncated`. The caller's answer-size bound.
  std::size_t max_bytes = std::numeric_limits<std::size_t>::max();
};
struct window_entry {
  int64_t start;      // inclusive, ms since the epoch
  int64_t end;        // exclusive
  std::string value;  // the aggregate (JSON)
  int64_t offset;     // offset of the last record folded into it
};
struct window_answer {
  std::vector<window_entry> windows;
  int32_t partition = -1;
  position pos;
  int64_t stream_time = -1;  // largest event time applied to the partition (-1: none yet)
  bool truncated = false;    // more windows than window_query::max_bytes allows exist
};

// Windows of every key of a windowed store in a range of group keys, overlapping
// [from, to): `range.from`/`range.to` bound the group keys (serialized bytes, half
// open), `range.after` is the stored key of the last window already returned (a
// cursor), `range.partitions` restricts to a scatter-gather part. `range.prefix` and
// `range.descending` are not used. Windows come in stored key order: group key bytes,
// then start, across all partitions.
struct window_range_query {
  range_query range;
  int64_t from = 0;
  int64_t to = 0;
};
struct window_range_entry {
  std::string stored_key;  // the window's RocksDB key: the merge order and the cursor
  std::string key;         // group key bytes
  window_entry window;
  int32_t partition;
};
struct window_range_answer {
  std::vector<window_range_entry> entries;
  bool more = false;  // windows beyond the limit exist
  position pos;
};

// The versions of one key of a versioned store valid at some time in [from, to), newest
// first, at most `limit` of them.
struct version_query {
  std::string store;
  std::string key;                   // serialized key bytes
  std::optional<int32_t> partition;  // the key's partition, when the caller located it
  int64_t from = 0;
  int64_t to = 0;
  size_t limit = 100;
};
struct version_entry {
  int64_t valid_from;
  std::optional<int64_t> valid_to;   // nullopt: still valid
  std::optional<std::string> value;  // nullopt: a tombstone (no value from valid_from on)
  int64_t offset;                    // offset of the record that wrote it
};
struct version_answer {
  std::vector<version_entry> versions;
  bool more = false;  // older versions overlapping [from, to) exist beyond the limit
  int32_t partition = -1;
  position pos;
  std::optional<int64_t> history_start;  // the earliest time answered; nullopt: no version yet
};

struct partition_info {
  int32_t partition;
  bool assigned;
  bool ready;
  std::optional<int64_t> position;  // stored next offset, if any
  int64_t catch_up_target;          // -1: unknown
};

struct store_info {
  const view_def* def;
  int32_t partition_count;                 // 0 until known
  std::vector<partition_info> partitions;  // partitions assigned here
  storage::view_stats stats;
};

class engine {
 public:
  // `partitioners` maps each store name to its key -> partition function.
  engine(const std::vector<view_def>& views, storage::db& db, const ownership_registry& ownership,
         std::map<std::string, partitioner_fn> partitioners);

  const std::vector<view_def>& views() const { return views_; }
  const view_def* find_store(std::string_view name) const;

  // The source topic and partition a key of a store lives in (the producers'
  // partitioner), or nullopt when the store or the partition count is unknown.
  std::optional<std::pair<std::string, int32_t>> locate(std::string_view store, std::string_view key) const;
  // The partition of each key of a store, by its partitioner and the partition count
  // known when it was made: locate() for many keys (a batch) at the cost of one.
  struct key_locator {
    const partitioner_fn* partitioner;
    int32_t partition_count;
    int32_t operator()(std::string_view key) const { return (*partitioner)(key, partition_count); }
  };
  std::optional<key_locator> locator(std::string_view store) const;

  // Latest value of a key, or with `as_of` (versioned stores) the value valid then. Fails
  // with not_active / not_up_to_date rather than answer "absent" for a partition this
  // instance does not hold current, and with history_unavailable for an `as_of` before
  // the partition's history.
  query_result<key_answer> get(const key_query& q) const;

  // The key from this instance's own copy of its partition, whoever owns it (a former
  // owner's or a standby's copy), with the position the copy reflects; failure
  // not_active when there is no copy here. For allow_stale reads only.
  query_result<key_answer> get_stale(const key_query& q) const;

  // True when this instance keeps a copy of the partition of `store` (a stored
  // position), whether it holds it current or not: what a from_copies range reads.
  bool has_copy(std::string_view store, int32_t partition) const;

  // Many keys at once (one MultiGet, one snapshot), each with its partition as
  // locate() found it; each must be on a partition held current here. With `as_of`
  // (versioned stores), the value each key had then: a key without a version valid
  // then, or with a tombstone, is absent; fails history_unavailable when `as_of` is
  // before the history of one of the keys' partitions.
  // The keys move into the answer's entries.
  query_result<batch_answer> get_many(std::string_view store, std::vector<std::pair<int32_t, std::string>> located,
                                      std::optional<int64_t> as_of = std::nullopt) const;

  // A range across every partition of the store, merged into one byte order. Needs
  // every partition of the topic current on this instance. `use`: page for a bounded
  // read (its blocks are cached), sweep for a read of a whole store (they are not).
  query_result<std::unique_ptr<range_stream>> open_range(const range_query& q, storage::scan_use use) const;
  // A page of at most `limit` entries of open_range(q).
  query_result<range_answer> range(const range_query& q, size_t limit) const;

  // Versions of a key of a versioned store, from one snapshot. Fails history_unavailable
  // when [from, to) lies wholly before the partition's history; a `from` before it is
  // raised to it (what precedes it is not known).
  query_result<version_answer> versions(const version_query& q) const;

  // Windows of a key of a windowed store, from one snapshot. Windows expired at the
  // partition's stream time (core/window.h) are never answered, whether or not
  // compaction has removed them from disk yet.
  query_result<window_answer> windows(const window_query& q) const;
  // A page of at most `limit` windows of window_range_query `q`. Like windows(), a
  // window expired at its partition's stream time is never answered. Reads one
  // snapshot; the windows outside [from, to) of each key are skipped, so a page reads
  // every stored window of the keys it passes.
  query_result<window_range_answer> window_range(const window_range_query& q, size_t limit) const;
  // Number of keys: exact (a scan) when the store holds at most `exact_limit` keys by
  // RocksDB's estimate, otherwise the estimate, marked inexact. In a store with a ttl the
  // exact count leaves expired keys out (storage never reads them); the estimate counts
  // what is on disk, expired keys that compaction has not deleted yet included.
  // With `partitions`, only those (a scatter-gather part); an estimate is then scaled by
  // their share of the topic's partitions.
  // With `as_of` (versioned stores): the keys that had a value at that time, always
  // exact (there is no estimate of a past time): a store whose estimate exceeds
  // `exact_limit` fails too_many_keys; history_unavailable as get_many().
  query_result<count_answer> count(std::string_view store, uint64_t exact_limit,
                                   const std::optional<std::vector<int32_t>>& partitions = std::nullopt,
                                   std::optional<int64_t> as_of = std::nullopt) const;

  // True when, for every (partition, offset) in `bound`, the record at that offset has
  // been applied (the stored next offset is beyond it). Partitions must exist.
  query_result<bool> reached(std::string_view store, const position& bound) const;
  // Current stored positions of every partition of a store held here.
  query_result<position> current_position(std::string_view store) const;

  // Metadata of a store: partitions, positions, size estimates.
  query_result<store_info> describe(std::string_view store) const;

 private:
  // windows() of a session store: `a` holds the partition and stream time read.
  query_result<window_answer> sessions(const window_query& q, storage::view_id vid, int32_t partition,
                                       window_answer a) const;
  std::vector<view_def> views_;
  storage::db& db_;
  const ownership_registry& ownership_;
  std::map<std::string, partitioner_fn, std::less<>> partitioners_;

  // A range query's column family, partitions (each held current here) and bounds,
  // with `prefix` and the cursor's `after` folded into the bounds.
  struct resolved_range {
    storage::view_id view;
    std::vector<int32_t> partitions;
    std::optional<std::string> lower, upper;
    std::vector<int32_t> copies;  // partitions read from a copy (range_query::from_copies)
  };
  // With `copies_allowed` and q.from_copies, a partition not held current here goes to
  // `copies` instead of failing.
  query_result<resolved_range> resolve_range(const range_query& q, bool copies_allowed = false) const;

  // Fails unless every partition of the view's topic is assigned here and current.
  template <typename T>
  std::optional<query_result<T>> require_all_partitions(const view_def& v, int32_t& count) const;
  template <typename T>
  std::optional<query_result<T>> require_partition(const view_def& v, int32_t partition) const;
  // The store, column family and partition of a key; fails unless the store is open and
  // the partition is held current here.
  template <typename T>
  std::optional<query_result<T>> held_key_partition(std::string_view store, std::string_view key,
                                                    std::optional<int32_t> located, const view_def*& view,
                                                    storage::view_id& vid, int32_t& partition) const;
  // A key's value and its partition's position from one snapshot; with `need_copy`, a
  // partition never applied here is not_active.
  query_result<key_answer> read_key(storage::view_id view, int32_t partition, std::string_view key,
                                    bool need_copy) const;
  // Fails unless `store` is versioned and each of `partitions` knows what was valid at
  // `as_of` (it is not before the partition's history): a partition that does not makes
  // a page unknown, not shorter.
  template <typename T>
  std::optional<query_result<T>> check_history(const storage::snapshot& snap, const std::string& store,
                                               storage::view_id view, const std::vector<int32_t>& partitions,
                                               int64_t as_of) const;
  // The keys of get_many() as of `as_of`, from `snap`; `a` holds their positions.
  query_result<batch_answer> get_many_as_of(const storage::snapshot& snap, const std::string& store,
                                            storage::view_id view,
                                            const std::vector<std::pair<int32_t, std::string>>& located,
                                            const std::vector<int32_t>& partitions, int64_t as_of,
                                            batch_answer a) const;
  // The keys of `partitions` that had a value at `as_of` (count() with as_of).
  query_result<count_answer> count_as_of(const storage::snapshot& snap, const std::string& store, storage::view_id view,
                                         const std::vector<int32_t>& partitions, int64_t as_of, count_answer a) const;
  // A versioned key's value at `as_of`, with the partition's position, from one snapshot.
  query_result<key_answer> read_key_as_of(storage::view_id view, int32_t partition, std::string_view key, int64_t as_of,
                                          bool need_copy) const;
};

}  // namespace kstate::query
