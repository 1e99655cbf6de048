#pragma once
// agg_pipeline: the aggregate views of one engine (internal to ingest).
//
// Stage 1 re-keys source records of re-keyed views into their repartition topics;
// stage 2 folds records of a view's store topic (repartition topic, or the source for
// group_by key) into per-key aggregates and writes each new aggregate to the view's
// changelog. Both stages run on the engine's consumer, in the engine's batches. Per
// batch, commit() makes the produced records and the consumed input offsets durable
// in Kafka (one transaction under exactly_once), then adds the aggregates and the
// positions they reach to the engine's RocksDB batch. The protocol and its crash
// points: docs/exactly-once.md.
//
// Threading: every member runs on the ingest thread (the rebalance callback included).

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/ownership.h"
#include "core/status.h"
#include "core/types.h"
#include "core/view.h"
#include "ingest/aggregation.h"
#include "ingest/batch_builder.h"
#include "ingest/engine.h"
#include "ingest/fk_join.h"
#include "ingest/join.h"
#include "storage/db.h"
#include "changelog_apply.h"
#include "session_fold.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
}  // namespace prometheus

namespace kstate::ingest {

// The changelog header carrying the store-topic offset of the record that produced an
// aggregate, so a restored value reports the same record offset as the original.
inline constexpr const char* changelog_offset_header = "kstate.offset";
// Session windows: the changelog header carrying the session's last record time (its
// key holds only the start), so a restore stores the same session.
inline constexpr const char* changelog_last_header = "kstate.last";
// The decimal number a changelog record carries in header `name`; nullopt when it has
// none or it is not one.
std::optional<int64_t> changelog_header_number(const rd_kafka_message_t* m, const char* name);
// The store-topic offset a changelog record carries in changelog_offset_header, or
// `fallback` when it has none or it is not a non-negative decimal number.
int64_t changelog_record_offset(const rd_kafka_message_t* m, int64_t fallback);
// How far a view's changelog partition is reflected in its store (a named position).
inline std::string changelog_position_name(const view_def& v) { return v.name + "#changelog"; }
// Windowed views: the partition's stream time (largest event time applied), kept with
// the state so closing and expiry continue where they were after a restart.
inline std::string stream_time_name(const view_def& v) { return stream_time_position_name(v); }

class agg_pipeline {
 public:
  // `views` (aggregate views only), `db`, `ownership` and `builder` outlive the pipeline.
  // An error names a view that has no column family in `db`.
  static result<std::unique_ptr<agg_pipeline>> create(const ingest_config& cfg,
                                                      const std::vector<const view_def*>& views, storage::db& db,
                                                      ownership_registry& ownership, batch_builder& builder,
                                                      prometheus::Registry* metrics);
  ~agg_pipeline();

  // Creates the producer (transactional under exactly_once; init_transactions fences a
  // previous incarnation of this instance) and the restore consumer, creates missing
  // repartition and changelog topics, and adds the topics the group consumer must read
  // to `subscribe`. Source partition counts must already be in `ownership`.
  status start(rd_kafka_t* consumer, std::set<std::string>& subscribe);
  bool handles(std::string_view topic) const { return topics_.count(std::string(topic)) > 0; }

  // Rebalance, step 1: where the consumer resumes a newly assigned partition (nullopt:
  // the beginning): the group's committed offset, which the transactions move with
  // the outputs. Notes which stores must catch up from their changelog first.
  result<std::optional<int64_t>> plan_assign(const std::string& topic, int32_t partition);
  // Step 2, between polls (the input partitions concerned are assigned and paused, so
  // the group sees this member poll however long a restore takes): applies the planned
  // changelog tails to the local stores for about `budget`, progress durable every
  // 10,000 records. Returns the input partitions whose every planned restore completed
  // in this call: they may be consumed from now on. A stop (`running` false) ends it
  // with what was applied written; the next start resumes there.
  result<std::vector<std::pair<std::string, int32_t>>> restore_some(std::chrono::milliseconds budget,
                                                                    const std::atomic<bool>& running);
  // Ends a restore in progress as a stop does: what it applied is written with the
  // changelog position it reached, and the next start goes on from there.
  status stop_restore();
  // Input partitions with a planned or running restore.
  size_t planned_count() const { return planned_.size() + (active_ ? 1 : 0); }
  bool restoring(const std::string& topic, int32_t partition) const;
  // The partition was revoked (after the last batch was committed): a restore of it in
  // progress stops with what it applied written, and the planned ones are dropped.
  status forget(const std::string& topic, int32_t partition);

  // Applies one consumed record of a handled topic (stage 1 and/or 2). An error (the
  // stored aggregate could not be read) leaves the batch unusable: the engine stops.
  status add(const record& r);
  bool pending() const { return !consumed_.empty(); }
  // True when the transactional producer hit a fatal error (e.g. an abort the broker
  // refused after a network cut): it is unusable, but a new one with the same
  // transactional.id fences it and goes on from the committed offsets.
  bool producer_failed() const;

  enum class outcome { committed, aborted, fatal };
  // Makes the batch durable in Kafka, then adds aggregates and positions to `batch`.
  // aborted: the transaction was aborted and the consumer rewound to the last
  // committed offsets (nothing of the batch's aggregates was kept); fatal: `error`
  // says why, the engine must stop. `sequence` numbers the engine's batches, in the
  // order its writer writes them: until written(sequence), the next batches fold into
  // this batch's aggregates, not into what RocksDB holds.
  outcome commit(storage::write_batch& batch, std::string& error, uint64_t sequence);
  // The engine's writer wrote every batch up to `sequence` to RocksDB.
  void written(uint64_t sequence);
  // After the RocksDB write of a committed batch: the consumed positions, to report.
  std::map<std::pair<std::string, int32_t>, int64_t> take_consumed();

  // Serves producer callbacks; call regularly.
  void poll();
  // Flushes and destroys the clients.
  void close();

  // Records applied from changelogs since start (all stores), for logs and tests.
  uint64_t restored_records() const { return restored_total_.load(); }
  // Records dropped because every window they fall in had closed (all views).
  uint64_t late_records() const { return late_total_.load(); }

 private:
  agg_pipeline(const ingest_config& cfg, storage::db& db, ownership_registry& ownership, batch_builder& builder);

  struct view_state {
    const view_def* def;
    storage::view_id id;
    aggregator agg;
    // Join views: the column family of the sides, and the joined value they make.
    std::optional<storage::view_id> sides;
    std::optional<joiner> join;
    // Foreign-key joins (agg_fk_join.cc) have two entries. The join view's own (the left
    // side, stage 2 of the repartition topic) keeps its rows in `sides` and routes
    // subscriptions with `fk_route`, the right topic's partitioner. The right side's
    // (stage 2 of the subscription topic) has `def` a view named `<view>#fk`, `id` its
    // column family, and `right_of` the index of the join view's entry.
    std::optional<partitioner_fn> fk_route;
    std::optional<size_t> right_of;
  };
  // The column families a changelog record of `v` updates (changelog_apply.h).
  static changelog_target target(const view_state& v) {
    return changelog_target{v.def, v.id, v.sides, v.join ? &*v.join : nullptr, v.right_of.has_value()};
  }
  struct cached {
    std::string state;       // aggregate JSON; a join's encoded sides (empty: none)
    int64_t input_offset;    // offset of the last record folded in
    int64_t timestamp = -1;  // event time of the last record folded in (changelog timestamp)
    bool dirty = false;      // changed in this batch (cache mode: not yet produced)
    // Session windows: the session's last record time (stored in a timed frame), or
    // deleted: merged into another session (a delete and a changelog tombstone).
    std::optional<int64_t> last;
    bool deleted = false;
  };

  // Topic administration (agg_topics.cc): creates missing repartition and changelog
  // topics, waits until metadata shows them and checks their partition counts.
  status create_topics();
  // `last`: a session's last record time, sent in the changelog_last_header.
  status produce(const std::string& topic, int32_t partition, std::string_view key,
                 std::optional<std::string_view> value, int64_t input_offset, int64_t timestamp,
                 std::optional<int64_t> last = std::nullopt);
  // The changelog record of a cached aggregate (a tombstone when it was deleted).
  status produce_changelog(const view_state& v, int32_t partition, const std::string& key, const cached& c);
  void begin_if_needed();
  // The stored aggregate of `key` (nullopt: none yet).
  result<std::optional<std::string>> current(view_state& v, int32_t partition, const std::string& key);
  // Rejects the record (counted, dead-lettered) when its event time `ts` is more than
  // the view's window.max_future ahead of the wall clock; true when it did.
  bool refuse_future(view_state& v, const record& r, int64_t ts);
  void stage1(view_state& v, const record& r);
  status stage2(view_state& v, const record& r);
  // Folds `value` into the aggregate of `key` (the stored key) in the batch's cache and
  // writes the changelog record; false when the view rejected the record.
  result<bool> fold(view_state& v, const record& r, const std::string& key, int64_t timestamp);
  // Session windows (agg_session.cc): folds the record at event time `ts` into the
  // sessions of `key`, merging those it bridges; false when it was late or rejected
  // (`late` says which).
  result<bool> fold_session(view_state& v, const record& r, const std::string& key, int64_t ts, int64_t stream_time,
                            bool& late);
  // The live sessions of `key` that a record at `t` reaches, ascending by start, as this
  // batch sees them: its cache, then the committed batches not written yet, then RocksDB.
  result<std::vector<stored_session>> sessions_near(view_state& v, int32_t partition, const std::string& key, int64_t t,
                                                    int64_t stream_time);
  outcome abort_and_rewind(std::string& error, const std::string& why);
  // Join views (agg_join.cc). Stage 1 marks a record of either input with its side and
  // keeps the batch's last one per key and side, produced at commit() to the same
  // partition of the view's repartition topic.
  void join_stage1(view_state& v, const record& r);
  // Stage 2: sets the record's side of its key's sides in the batch's cache.
  status join_stage2(view_state& v, const record& r);
  // A join key's stored state (a key join's sides, a foreign-key join's row) as this
  // batch sees it: its cache, the committed batches not written yet, then RocksDB.
  // Empty: none.
  result<std::string> join_state(view_state& v, int32_t partition, const std::string& key);
  // Sets a join key's new state in the batch's cache (and, without the record cache,
  // sends its changelog record now).
  void set_join_state(view_state& v, const record& r, std::string key, std::string state);
  // The changelog value of a cached state: a join's empty sides are a tombstone.
  std::optional<std::string_view> changelog_value(const view_state& v, const std::string& state) const;
  // Adds a key's new sides to `batch`: the sides, and the joined value they make (or
  // its deletion), framed with `input_offset`.
  void join_write(storage::write_batch& batch, const view_state& v, int32_t partition, std::string_view key,
                  std::string_view sides, int64_t input_offset);
  // Co-partitioned inputs (same partition count), and a repartition topic of that count;
  // a foreign-key join's internal topics with their inputs' partition counts.
  status check_join_topics(const std::map<std::string, int32_t>& counts) const;
  // Foreign-key joins (agg_fk_join.cc). The left side: a copy of a left record changes
  // the key's row and sends (un)subscriptions; a response answers the row's current
  // subscription (a stale one is dropped).
  status fk_left_stage2(view_state& v, const record& r);
  // The right side: a copy of a right record replaces the foreign key's right value and
  // answers each of its subscriptions; a subscription is kept and answered; an
  // unsubscription removes an older subscription.
  status fk_right_stage2(view_state& v, const record& r);
  // The right side's entry `key` of partition `q` as this batch sees it: its cache, the
  // committed batches not written yet, then RocksDB. nullopt: none.
  result<std::optional<std::string>> fk_entry(view_state& v, int32_t q, const std::string& key);
  // Sets (or with nullopt deletes) a right side's entry in the batch's cache.
  void fk_set(view_state& v, const record& r, const std::string& key, std::optional<std::string> value);
  // The subscriptions of foreign key `fk` in partition `q` (left key, subscription).
  result<std::vector<std::pair<std::string, fk_subscription>>> fk_subscribers(view_state& v, int32_t q,
                                                                              const std::string& fk);
  // Adds a left row to `batch`: the row in the sides column family and the joined value
  // it makes (or their deletion), framed with `input_offset`.
  void fk_left_write(storage::write_batch& batch, const view_state& v, int32_t partition, std::string_view key,
                     std::string_view row, int64_t input_offset);
  // Changelog restore (agg_restore.cc, with plan_assign and restore_some).
  struct planned;
  struct active_restore;
  status begin_restore(const planned& p);
  // Writes the running restore's batch with the changelog position (and stream time) it
  // reached; `done` adds the input position and ends it.
  status checkpoint_restore(bool done);
  // Ends the running restore before its end (a stop, or its partition revoked).
  status end_restore(bool stopping);

  const ingest_config& cfg_;
  std::vector<view_state> views_;
  // The views of foreign-key joins' right sides (a deque: views_ points into it).
  std::deque<view_def> fk_right_defs_;
  storage::db& db_;
  ownership_registry& ownership_;
  batch_builder& builder_;
  bool exactly_once_;
  rd_kafka_t* consumer_ = nullptr;  // the engine's; not owned
  rd_kafka_t* producer_ = nullptr;
  rd_kafka_t* restorer_ = nullptr;
  partitioner_fn murmur2_;
  std::set<std::string> topics_;                                    // every topic the group consumer reads for us
  std::map<std::string, std::vector<size_t>, std::less<>> stage1_;  // source topic -> re-keyed views
  std::map<std::string, std::vector<size_t>, std::less<>> stage2_;  // store topic -> views

  // Next input offset per (topic, partition): at the last commit, and consumed since.
  std::map<std::pair<std::string, int32_t>, int64_t> committed_;
  std::map<std::pair<std::string, int32_t>, int64_t> consumed_;
  // Aggregates touched in this batch: (view index, partition, key).
  std::map<std::tuple<size_t, int32_t, std::string>, cached> cache_;
  // Stage 1 of views that are not windowed: the batch's source records combined per
  // (view index, group key), produced to the repartition topic at commit().
  std::map<std::pair<size_t, std::string>, partial_aggregate> partials_;
  // Stage 1 of join views: the batch's last record per (view index, partition, key,
  // side): its value (nullopt: a tombstone) and timestamp.
  struct join_pending {
    std::optional<std::string> value;
    int64_t timestamp = -1;
  };
  std::map<std::tuple<size_t, int32_t, std::string, join_side>, join_pending> join_partials_;
  // Aggregates of committed batches that the engine's writer may not have written yet,
  // with the batch that wrote each last; fold() reads them before RocksDB. By batch, in
  // commit order, the keys each wrote, to forget them once written.
  struct unwritten {
    uint64_t sequence;
    std::string state;
    std::optional<int64_t> last;  // sessions: as cached::last
    bool deleted = false;         // sessions: merged away, deleted by that batch
  };
  std::map<std::tuple<size_t, int32_t, std::string>, unwritten> unwritten_;
  std::deque<std::pair<uint64_t, std::vector<std::tuple<size_t, int32_t, std::string>>>> unwritten_batches_;
  bool in_txn_ = false;
  // Delivery results of the current batch (producer callbacks, ingest thread).
  std::map<std::pair<std::string, int32_t>, int64_t> delivered_end_;  // changelog partition -> last offset + 1
  rd_kafka_resp_err_t delivery_error_ = RD_KAFKA_RESP_ERR_NO_ERROR;
  // Planned restores: (view index, input topic and partition, from changelog offset,
  // input resume).
  struct planned {
    size_t view;
    std::string topic;
    int32_t partition;
    int64_t from;
    std::optional<int64_t> resume;
  };
  std::deque<planned> planned_;
  // The restore in progress, carried over from one restore_some() to the next.
  struct active_restore {
    active_restore(planned p, storage::write_batch b) : plan(std::move(p)), batch(std::move(b)) {}
    planned plan;
    int64_t from = 0;  // first changelog offset read
    int64_t high = 0;  // end of the changelog partition when the restore began
    int64_t end = 0;   // next changelog offset to read
    uint64_t applied = 0;
    int64_t stream_time = -1;
    storage::write_batch batch;
    std::chrono::steady_clock::time_point started;
  };
  std::optional<active_restore> active_;
  std::atomic<uint64_t> restored_total_{0};
  std::atomic<uint64_t> late_total_{0};
  // Windowed views: stream time (largest event time seen) per (view index, partition),
  // as of the last commit and as of the records added since.
  std::map<std::pair<size_t, int32_t>, int64_t> stream_time_committed_;
  std::map<std::pair<size_t, int32_t>, int64_t> stream_time_;
  prometheus::Family<prometheus::Counter>* m_late_ = nullptr;
  prometheus::Family<prometheus::Counter>* m_restored_ = nullptr;
  prometheus::Family<prometheus::Counter>* m_txn_ = nullptr;
  prometheus::Family<prometheus::Counter>* m_future_ = nullptr;
  prometheus::Family<prometheus::Counter>* m_unmatched_ = nullptr;

  friend void agg_delivery_report(rd_kafka_t*, const rd_kafka_message_t*, void*);
};

}  // namespace kstate::ingest
