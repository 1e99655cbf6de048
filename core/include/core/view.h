#pragma once
// view_def: a view as configured, the vocabulary shared by ingest (which materializes
// it) and query (which answers from it).

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/window.h"

namespace kstate {

enum class data_format { string, json, bytes };
// table: latest value per key. count, sum, reduce, aggregate: per-key aggregates of a
// stream, optionally re-keyed (group_by), changelogged (see docs/exactly-once.md).
// join: two tables joined on the key, through the aggregates' pipeline.
enum class view_kind { table, count, sum, reduce, aggregate, join };
// Which keys a join view holds: those with both sides (inner), with a left side
// (left), with either side (outer).
enum class join_type { inner, left, outer };
// Where an aggregate's key comes from: the record key (no repartition), a field of
// the JSON value, or each word of the value (one record per word).
enum class group_by_kind { key, json, words };
// What `reduce` keeps of the numbers it sees.
enum class reduce_op { latest, min, max };
// The parts of an `aggregate` view's JSON object.
enum class agg_field { count, sum, min, max, mean };
// Which time a table view's time to live counts a key's age from: the timestamp of the
// record that last updated it, or when that record was applied (docs/configuration.md
// says how each behaves in a rebuild).
enum class ttl_clock { record_time, ingest_time };

const char* to_string(data_format f) noexcept;
const char* to_string(view_kind k) noexcept;
const char* to_string(group_by_kind g) noexcept;
const char* to_string(reduce_op r) noexcept;
const char* to_string(agg_field f) noexcept;
const char* to_string(ttl_clock c) noexcept;
const char* to_string(join_type t) noexcept;
bool parse_data_format(std::string_view s, data_format& out) noexcept;
bool parse_view_kind(std::string_view s, view_kind& out) noexcept;
bool parse_reduce_op(std::string_view s, reduce_op& out) noexcept;
bool parse_agg_field(std::string_view s, agg_field& out) noexcept;
bool parse_ttl_clock(std::string_view s, ttl_clock& out) noexcept;
bool parse_join_type(std::string_view s, join_type& out) noexcept;

// A table view's time to live: a key whose last update is `after_ms` or more old (by
// `clock`, against the wall clock) is never served, and compaction deletes it.
struct ttl_spec {
  int64_t after_ms = 0;  // > 0
  ttl_clock clock = ttl_clock::record_time;
};

// One field of a join view's projected value: the field at `path` (dotted) of one
// side's JSON value, named `as` in the joined object.
struct join_field {
  bool right = false;  // false: the left value's field
  std::string path;
  std::string as;
};

// A join view (kind join): its left input is the view's `source`, its right input
// `right_topic`; both are tables (a null value deletes the key's side).
struct join_spec {
  join_type type = join_type::inner;
  std::string right_topic;
  // The partitioner the right topic's producers use; must equal the view's
  // `partitioner` (the left topic's): co-partitioned inputs hold a key in partitions of
  // the same number.
  std::string right_partitioner = "murmur2";
  // Without `select`, the joined value is {"<left_name>": left, "<right_name>": right},
  // a missing side null.
  std::string left_name = "left";
  std::string right_name = "right";
  // Non-empty: the joined value is an object of these fields, in this order (a missing
  // side or field: null).
  std::vector<join_field> select;
  // A foreign-key join (docs/fk-joins.md): the dotted path of the left value's field
  // naming the right key; empty: a join on the key. `right_partitioner` is then the
  // right topic's own partitioner, which routes each foreign key's subscriptions to
  // the partition of its right records; the inputs need not be co-partitioned.
  std::string foreign_key;
  // Foreign-key joins: `<application.id>-<name>-subscription` (keyed by foreign key,
  // partitioned as the right topic) and its compacted changelog
  // `<application.id>-<name>-subscription-changelog`.
  std::string subscription_topic;
  std::string subscription_changelog_topic;
  bool by_foreign_key() const noexcept { return !foreign_key.empty(); }
};

// A versioned table view keeps, besides the latest value of each key, its earlier
// versions by record timestamp: those valid at some time within `history_ms` of the
// partition's stream time (largest record timestamp applied). docs/configuration.md.
struct versioned_spec {
  int64_t history_ms = 0;  // > 0
  // A record timestamped more than this ahead of the wall clock is rejected (counted,
  // dead-lettered) and never moves stream time. >= 0. Default 24 h.
  int64_t max_future_ms = 24LL * 3600 * 1000;
};

struct view_def {
  // Store name, used in URLs (/v1/stores/{name}) and as the RocksDB column family.
  std::string name;
  view_kind kind = view_kind::table;
  // The topic whose partitions the store's partitions are: a table's source topic; an
  // aggregate's repartition topic (re-keyed views) or its source topic (group_by key).
  // Routing and ownership are by this topic.
  std::string topic;
  // The topic records are read from. Equal to `topic` except for re-keyed aggregates.
  std::string source;
  // How record keys are validated and rendered. Default string (UTF-8).
  data_format key_format = data_format::string;
  // How record values are validated and rendered. Default json. Aggregates store JSON
  // whatever the source values are; this is the format of the values they read.
  data_format value_format = data_format::json;
  // Producers' partitioner used to route keys: murmur2 (Java client default),
  // consistent (librdkafka default, crc32), fnv1a. Re-keyed aggregates: murmur2.
  std::string partitioner = "murmur2";
  // Topic receiving records this view rejects; empty: none (rejections are only
  // counted and logged).
  std::string dead_letter_topic;
  // Table views only: keys expire this long after their last update; nullopt: never.
  std::optional<ttl_spec> ttl;
  // Table views only: keep versions of each key for as-of reads; nullopt: latest only.
  // Not combined with ttl.
  std::optional<versioned_spec> versioned;

  // --- aggregate views only ---
  group_by_kind group_by = group_by_kind::key;
  // group_by json: dotted path of the field whose value is the group key.
  std::string group_path;
  // Dotted path of the number to aggregate in a JSON value; empty: the whole value.
  std::string value_path;
  // kind reduce: what to keep.
  reduce_op reduce = reduce_op::latest;
  // kind aggregate: the fields of the per-key JSON object, in this order.
  std::vector<agg_field> fields;
  // `<application.id>-<name>-repartition` for re-keyed views, else empty.
  std::string repartition_topic;
  // Partitions of the repartition topic when kstate creates it; 0: as the source.
  int32_t repartition_partitions = 0;
  // `<application.id>-<name>-changelog`.
  std::string changelog_topic;
  // Replication factor of topics kstate creates; -1: the broker's default.
  int replication_factor = -1;
  // Extra topic configs of the changelog (cleanup.policy=compact is always set).
  std::map<std::string, std::string> changelog_configs;
  // true: one changelog record per key per batch (the last update, as Kafka Streams'
  // record cache); false: one changelog record per update. Default true.
  bool cache = true;
  // Windowed aggregates: the aggregate is kept per (key, window); nullopt: not windowed.
  // The stored key is encode_windowed_key(group key, window start) (core/window.h).
  std::optional<window_spec> window;

  // --- join views only (kind join). `topic` is the view's repartition topic, holding
  // both inputs' records, marked with their side, in the partition of the same number.
  std::optional<join_spec> join;

  // The topic records are read from (`source`, or `topic` when it is not set).
  const std::string& input_topic() const noexcept { return source.empty() ? topic : source; }
  bool is_aggregate() const noexcept { return kind != view_kind::table; }
  bool windowed() const noexcept { return window.has_value(); }
  // Views that read their store topic from a repartition topic kstate writes.
  bool rekeyed() const noexcept { return is_join() || (is_aggregate() && group_by != group_by_kind::key); }
  bool is_join() const noexcept { return kind == view_kind::join; }
  bool is_fk_join() const noexcept { return is_join() && join->by_foreign_key(); }
};

// Name of the stored position holding a windowed or versioned view's stream time per partition
// (written by ingest with the state, read by queries to hide expired windows).
inline std::string stream_time_position_name(const view_def& v) { return v.name + "#stream_time"; }

// Name of the column family holding a join view's sides (each key's latest left and
// right value), beside the joined values served under the view's own name. View names
// never contain '#', so it never collides with a view.
inline std::string join_sides_name(const view_def& v) { return v.name + "#sides"; }

// Name of the column family holding a foreign-key join's right side: each foreign key's
// right value and the left keys that subscribe to it, partitioned as the subscription
// topic. Its positions (store and changelog) are offsets of that topic and its changelog.
inline std::string fk_right_name(const view_def& v) { return v.name + "#fk"; }

// Every column family the views need: one per view, a join view's sides, and a
// foreign-key join's right side.
std::vector<std::string> column_family_names(const std::vector<view_def>& views);

}  // namespace kstate
