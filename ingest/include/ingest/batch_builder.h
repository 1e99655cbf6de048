#pragma once
// batch_builder: turns consumed records into one storage::write_batch holding the
// state changes of every view reading the record's topic and the positions those
// changes reach. Pure logic, no Kafka: the engine feeds it records, tests feed it too.
//
// Thread safety: none; owned by the ingest thread.

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "core/json_check.h"
#include "core/status.h"
#include "core/view.h"
#include "storage/db.h"

namespace kstate::ingest {

// A consumed record, borrowed from the consumer for the duration of add().
struct record {
  std::string_view topic;
  int32_t partition = 0;
  int64_t offset = 0;
  std::optional<std::string_view> key;    // nullopt: null key
  std::optional<std::string_view> value;  // nullopt: tombstone
  int64_t timestamp = -1;                 // record timestamp, ms since the epoch (-1: none)
};

// A record a view refused, with the reason; owns copies of its bytes so it can be
// dead-lettered after the consumer released the message.
struct rejection {
  std::string view;
  std::string dead_letter_topic;
  std::string topic;
  int32_t partition;
  int64_t offset;
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::string reason;
};

// Records seen, and their applications to views, in one batch.
struct record_counts {
  uint64_t records = 0, bytes = 0, applied = 0, invalid = 0;
};

// Everything a batch_builder collected since its last take(): the write that applies it
// and what to report once it is written.
struct built_batch {
  // The state changes, followed by the position each touched (view, partition) reaches.
  storage::write_batch batch;
  std::vector<rejection> rejections;
  // Partitions touched, with the next offset they reach.
  std::map<std::pair<std::string, int32_t>, int64_t> touched;
  std::map<std::pair<std::string, int32_t>, record_counts> partition_counts;
  // applied/invalid per (view, topic, partition).
  std::map<std::tuple<std::string, std::string, int32_t>, record_counts> view_counts;
  // Partitions whose end (the offset after their last record) the consumer reached
  // with this batch: current once it is written.
  std::vector<std::tuple<std::string, int32_t, int64_t>> ends;
  size_t records = 0;
  // The batch's number in the order the engine hands batches to its writer.
  uint64_t sequence = 0;
  // Bytes the batch holds (for the apply stage's bound).
  size_t bytes() const { return batch.byte_size() + 64 * rejections.size(); }
};

// Validates a record against a view's formats. Empty string: valid; otherwise the
// reason it is rejected. A `json` key or value must be one JSON document as
// check_json() (core/json_check.h) decides, nested at most `max_json_depth` deep.
std::string validate(const view_def& view, const record& r, int max_json_depth);

class batch_builder {
 public:
  // `views` must outlive the builder. Records are validated with `max_json_depth`
  // (ingest_config::max_json_depth). An error names a view (other than an aggregate,
  // which this builder does not apply) that has no column family in `db`.
  //
  // Views with a ttl store each value with its time (core/value_codec.h timed frames),
  // as ttl_time() gives it; `clock` (ms since the epoch; empty: the system clock) is the
  // ingest time.
  static result<std::unique_ptr<batch_builder>> create(storage::db& db, const std::vector<view_def>& views,
                                                       int max_json_depth = default_max_json_depth,
                                                       std::function<int64_t()> clock = {});

  // Records of the partition before `end` (its end offset when it was assigned) are
  // re-applied while catching up: they may have been applied before, on this instance
  // or another, at a time unknown here (see ttl_time()). Unknown end: the largest offset.
  void set_catch_up(std::string_view topic, int32_t partition, int64_t end);

  // The time a view with time to live `ttl` keeps with record `r`: when its key was last
  // updated, as the ttl counts it.
  //  - record_time: the record's timestamp. The source topic keeps it, so a rebuild
  //    gives every key the same time again: an expired key stays expired.
  //  - ingest_time: `now` for a record applied for the first time. A record applied
  //    while catching up gets min(now, its timestamp): it was first applied no earlier
  //    than it was written (its timestamp), so its key expires no later than it first
  //    did, and an expired key stays expired; it may expire earlier than before.
  //  A record without a timestamp (-1) gets `now`, whatever the clock.
  static int64_t ttl_time(const ttl_spec& ttl, const record& r, bool catching_up, int64_t now) noexcept;

  // Sets where each view stands on a partition (loaded from storage on assignment);
  // records below it are already reflected and are skipped for that view.
  void set_view_position(std::string_view topic, int32_t partition, const std::string& view, int64_t next_offset);
  // Forgets the positions of a revoked partition.
  void forget_partition(std::string_view topic, int32_t partition);
  // Where the slowest view of the topic stands, or nullopt when any view has no position.
  std::optional<int64_t> resume_offset(std::string_view topic, int32_t partition) const;

  // Applies the record to every view of its topic (or records a rejection).
  void add(const record& r);

  // Records a rejection by a view this builder does not apply itself (an aggregate),
  // counted like its own.
  void reject(const view_def& view, const record& r, std::string reason);
  // Counts one application of a record to a view this builder does not apply itself.
  void note_applied(const std::string& view, std::string_view topic, int32_t partition);

  size_t pending_records() const { return pending_; }
  // The batch to write: the state changes added so far (in view, partition and key
  // order, a key changed twice only with its last change), followed by the position
  // each touched (view, partition) reaches. A position is written once per batch, not once
  // per record: RocksDB would keep every version of it in the memtable.
  storage::write_batch& batch();
  const std::vector<rejection>& rejections() const { return rejections_; }
  // Partitions touched since the last reset, with the next offset they reach.
  const std::map<std::pair<std::string, int32_t>, int64_t>& touched() const { return touched_; }
  // Counts per (topic, partition) since the last reset.
  using counts = record_counts;
  const std::map<std::pair<std::string, int32_t>, counts>& partition_counts() const { return counts_; }
  // applied/invalid per (view, topic, partition) since the last reset.
  const std::map<std::tuple<std::string, std::string, int32_t>, counts>& view_counts() const { return view_counts_; }

  // Starts a new batch (after the current one was written).
  void reset();
  // Moves the batch out, positions written, and starts a new one in `fresh` (a cleared
  // write_batch of this builder's db; a new one when empty).
  built_batch take(std::optional<storage::write_batch> fresh = std::nullopt);

 private:
  batch_builder(storage::db& db, int max_json_depth, std::function<int64_t()> clock);

  struct view_slot {
    const view_def* def;
    storage::view_id id;
  };
  struct view_position {
    int64_t next = 0;    // next offset the view reflects
    bool dirty = false;  // moved since the batch's positions were last written
  };
  // What add() needs for one (topic, partition), found once per run of records from
  // it rather than once per record: records arrive in runs per partition. Points into
  // the maps below; std::map nodes stay put until erased, and every erase drops it.
  struct partition_cursor {
    std::string topic;
    int32_t partition = -1;
    const std::vector<view_slot>* slots = nullptr;  // null: no view reads the topic
    std::pair<std::string, int32_t> tp;
    counts* totals = nullptr;
    int64_t* touched = nullptr;
    std::vector<view_position*> positions;  // parallel to *slots
    std::vector<counts*> per_view;          // parallel to *slots
    int64_t catch_up_end = 0;               // set_catch_up(); 0: none
  };
  partition_cursor& cursor_for(std::string_view topic, int32_t partition);
  // Keeps a put (value) or a delete (nullopt) of the record at `offset` for the batch.
  // `time`: the value's time for a view with a ttl, else nullopt.
  void stage(storage::view_id view, int32_t partition, std::string_view key, std::optional<std::string_view> value,
             int64_t offset, std::optional<int64_t> time);
  // Adds the staged changes to the batch, sorted by key, the last of each key only.
  void write_staged();
  // write_staged(), then the positions the batch reaches.
  void write_positions();

  storage::db& db_;
  int max_json_depth_;
  std::function<int64_t()> clock_;  // never empty
  // (topic, partition) -> offset before which records are re-applied (set_catch_up).
  std::map<std::pair<std::string, int32_t>, int64_t, std::less<>> catch_up_;
  std::map<std::string, std::vector<view_slot>, std::less<>> by_topic_;
  // (view id, topic, partition) -> where the view stands
  std::map<std::tuple<storage::view_id, std::string, int32_t>, view_position, std::less<>> view_pos_;
  partition_cursor cursor_;
  bool cursor_valid_ = false;
  storage::write_batch batch_;
  // The changes of the records added since the batch was last written out: their bytes
  // in arena_, in arrival order (write_staged sorts them).
  struct staged {
    storage::view_id view;
    int32_t partition;
    int64_t offset;
    int64_t time;  // views with a ttl: the value's time
    size_t key_at, value_at;
    uint32_t key_size, value_size = 0;
    bool deleted;
    bool timed;  // a view with a ttl: stored in a timed frame
  };
  std::string arena_;
  std::vector<staged> staged_;
  std::vector<uint32_t> order_;
  std::vector<rejection> rejections_;
  std::map<std::pair<std::string, int32_t>, int64_t> touched_;
  std::map<std::pair<std::string, int32_t>, counts> counts_;
  std::map<std::tuple<std::string, std::string, int32_t>, counts> view_counts_;
  size_t pending_ = 0;
};

}  // namespace kstate::ingest
