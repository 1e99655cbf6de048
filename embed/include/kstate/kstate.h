#pragma once
/// @file kstate/kstate.h
/// kstate as a library: define views in code, run a node (an instance of a kstate
/// group) inside the application, and query it in process with the answers the REST
/// API gives (docs/embedding.md). RocksDB, librdkafka and Beast stay behind this
/// header; only the standard library is needed to compile against it.
///
/// Threading: a node is created, started and stopped from one controlling thread. Its
/// queries may be called from any number of threads between start() and stop(); each
/// blocks its caller until answered (a min_position wait included). Change listeners
/// run on threads of their own.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kstate/version.h"

namespace kstate::embed {

/// The version of the kstate library linked, "major.minor.patch" (KSTATE_VERSION_STRING
/// is the version of the header compiled against).
const char* version() noexcept;

/// Why a call has no answer, and what the caller should do about it.
enum class error_code {
  invalid_argument,    ///< The request or the options are wrong: fix them, do not retry.
  not_found,           ///< No store of that name (a missing key is not an error).
  not_here,            ///< The key's partition is owned by another instance: error::owner names it (routing::not_here).
  unavailable,         ///< Transient (catching up, rebalancing, stopping): retry later; error::retry_after says when.
  deadline_exceeded,   ///< A min_position wait ran out of time: retry with a longer timeout.
  resource_exhausted,  ///< Over a configured limit (batch size, answer bytes, waits): ask for less.
  internal,            ///< Storage failure or a bug: report it.
};

/// Name of an error code ("not_here").
const char* to_string(error_code c) noexcept;

/// A failed call.
struct error {
  error_code code = error_code::internal;
  /// What went wrong, naming the option or parameter at fault.
  std::string message;
  /// not_here: the endpoint of the instance that owns the key's partition (its REST
  /// API, e.g. "http://10.0.0.5:8080"); empty when no owner is known (rebalancing).
  std::string owner;
  /// unavailable: how long to wait before retrying, when the answer said.
  std::optional<std::chrono::seconds> retry_after;
  /// The REST API's status and error_code for the same failure (e.g. 503 and 50301).
  int http_status = 0;
  int rest_error_code = 0;
};

/// A value or an error. Never both, never neither.
template <typename T>
class [[nodiscard]] result {
 public:
  /// A success.
  result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  /// A failure.
  result(error e) : v_(std::in_place_index<1>, std::move(e)) {}  // NOLINT: implicit by design

  /// True on success.
  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  /// The answer. Precondition: ok().
  const T& value() const& { return std::get<0>(v_); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  /// The failure. Precondition: !ok().
  const error& err() const { return std::get<1>(v_); }

 private:
  std::variant<T, error> v_;
};

/// A result without a value: success, or an error.
struct done {};
using status = result<done>;

/// Per partition of a store's topic, the next offset the answer reflects: every record
/// of the partition before it is applied, none after it.
using position = std::map<int32_t, int64_t>;

// ---------------------------------------------------------------------------------
// Defining views and nodes. The options are the YAML configuration's (docs/
// configuration.md), typed; create() checks them with the same rules and messages.
// ---------------------------------------------------------------------------------

/// The kinds of view (YAML `kind`).
enum class view_kind { table, count, sum, reduce, aggregate, join };
/// How keys or values are read and rendered (YAML `key_format`, `value_format`).
enum class data_format { string, json, bytes };

/// A window of an aggregate view (YAML `window`). Durations are written as in YAML:
/// "500ms", "10s", "1m", "2h", "1d".
struct window_options {
  std::string type = "tumbling";  ///< tumbling, hopping or session
  std::string size;               ///< tumbling and hopping windows: required
  std::string advance;            ///< hopping windows: required
  std::string inactivity_gap;     ///< session windows: required
  std::string grace;              ///< empty: the default
  std::string retention;          ///< empty: the default
  std::string time_field;         ///< dotted path of the event time in the value; empty: the record timestamp
  std::string max_future;         ///< empty: the default
};

/// A join view's join (YAML `join`; docs/configuration.md#join-views): `topic` is the
/// left table, `right` the right one, joined on the key or on a foreign key.
struct join_options {
  std::string type;               ///< inner (default), left or outer
  std::string right;              ///< the right table's topic; required
  std::string right_partitioner;  ///< empty: the view's partitioner
  std::string left_name;          ///< the left value's member; empty: "left"
  std::string right_name;         ///< the right value's member; empty: "right"
  /// Instead of both values: these fields, in this order (YAML `select`).
  struct field {
    std::string side;   ///< left or right
    std::string field;  ///< dotted path in that side's value
    std::string as;     ///< member name in the joined value
  };
  std::vector<field> select;
  /// A foreign-key join (docs/configuration.md#foreign-key-joins): the dotted path of
  /// the left value's field naming the right key; empty: a join on the key.
  std::string foreign_key;
};

/// One view (YAML: an entry of `views`). Empty strings and unset optionals mean "not
/// given", i.e. YAML's default.
struct view_options {
  std::string name;  ///< store name; required
  view_kind kind = view_kind::table;
  std::string topic;                        ///< source topic; required
  std::optional<data_format> key_format;    ///< default string
  std::optional<data_format> value_format;  ///< default json
  std::string partitioner;                  ///< murmur2 (default), consistent, fnv1a
  std::string dead_letter_topic;            ///< empty: none
  // --- aggregate views only ---
  /// "key" (default), "words", or "json:<dotted path>" (YAML `group_by: {json: path}`).
  std::string group_by;
  std::string value;                ///< dotted path of the number to aggregate
  std::string reduce;               ///< kind reduce: latest, min or max
  std::vector<std::string> fields;  ///< kind aggregate: count, sum, min, max, mean
  int repartition_partitions = 0;   ///< 0: not given
  std::optional<int> replication_factor;
  std::map<std::string, std::string> changelog_configs;
  std::optional<bool> cache;
  std::optional<window_options> window;
  /// kind join: the join (required for it).
  std::optional<join_options> join;
};

/// A node: one instance of a kstate group (YAML: the top level). Everything the YAML
/// file can set is reachable: the common settings as fields, any other key through
/// `settings` (dotted paths, as --set takes them: "query.max_limit",
/// "rocksdb.block_cache_mb", "ingest.max_batch_delay_ms").
struct node_options {
  std::string application_id;     ///< consumer group id; required
  std::string bootstrap_servers;  ///< Kafka; required
  std::string state_dir;          ///< empty: "./kstate-state"
  /// Whether the node serves the REST API over HTTP (probes, metrics, requests other
  /// instances forward to it). A node of a group of several instances must: the others
  /// reach it only that way. Default false: the application's own queries only.
  bool serve_http = false;
  /// http.listen ("127.0.0.1:8080"; port 0 picks a free one). Empty: YAML's default.
  std::string listen;
  /// The endpoint other instances reach this one at; empty: derived from `listen`.
  std::string advertised_endpoint;
  int standby_replicas = 0;
  /// librdkafka properties (YAML `kafka`).
  std::map<std::string, std::string> kafka;
  /// Any other configuration key by dotted path, applied last.
  std::vector<std::pair<std::string, std::string>> settings;
  std::vector<view_options> views;  ///< at least one
};

// ---------------------------------------------------------------------------------
// Queries. Keys and values are the serialized bytes producers wrote, except that a
// json value is returned as the REST API renders it: compact, object members sorted.
// ---------------------------------------------------------------------------------

/// What a query does when data it needs lives on another instance.
enum class routing {
  forward,   ///< ask the owner (as the REST API does) and return its answer
  not_here,  ///< fail with error_code::not_here naming the owner
};

/// Options common to every query.
struct read_options {
  /// Wait until these offsets of the store's topic are applied (read-your-writes),
  /// up to `timeout`; partitions the query does not read are ignored.
  position min_position;
  /// Longest min_position wait; nullopt: query.default_wait_ms.
  std::optional<std::chrono::milliseconds> timeout;
  routing route = routing::forward;
  /// Versioned stores (`versioned` in the view's configuration), get() and range()
  /// only: the values as of this time, ms since the epoch; nullopt: the latest.
  std::optional<int64_t> as_of;
};

/// A stored entry: a key, its value and the record that wrote it.
struct entry {
  std::string key;
  std::string value;
  int32_t partition = -1;
  int64_t offset = -1;  ///< offset of the record that wrote the value
};

/// The answer for one key.
struct key_result {
  std::optional<std::string> value;  ///< nullopt: absent as of `pos`
  int32_t partition = -1;
  int64_t offset = -1;    ///< -1 when absent
  position pos;           ///< the key's partition's position
  std::string served_by;  ///< the instance that answered
  /// With read_options::as_of and a value: when the version answered became valid, and
  /// when it stopped (nullopt: it is still the latest).
  std::optional<int64_t> valid_from, valid_to;
};

/// The answer for many keys.
struct multi_result {
  /// In request order; value nullopt for an absent key.
  std::vector<key_result> keys;
  position pos;  ///< every partition read
};

/// A range of keys in serialized byte order across all partitions (half open).
struct range_options {
  std::optional<std::string> from;    ///< inclusive
  std::optional<std::string> to;      ///< exclusive
  std::optional<std::string> prefix;  ///< keys starting with these bytes
  bool descending = false;
  /// Entries per page; 0: query.default_limit. At most query.max_limit.
  uint32_t limit = 0;
  /// The `next` of the previous page; empty: the first page.
  std::string cursor;
};

/// One page of a range.
struct range_page {
  std::vector<entry> entries;
  std::optional<std::string> next;  ///< cursor of the next page; nullopt: the last page
  position pos;
};

/// The number of keys of a store.
struct count_result {
  uint64_t count = 0;
  bool exact = false;  ///< false: RocksDB's estimate (above query.exact_count_limit)
  position pos;
};

/// One window of a windowed store.
struct window_value {
  int64_t start = 0;  ///< inclusive, ms since the epoch
  int64_t end = 0;    ///< exclusive
  std::string value;  ///< the aggregate (JSON)
  int64_t offset = -1;
};

/// The windows of one key overlapping [from, to).
struct windows_result {
  std::vector<window_value> windows;
  int32_t partition = -1;
  position pos;
};

/// Windows of a range of keys of a windowed store (half open), overlapping an interval
/// of event time.
struct windows_range_options {
  std::optional<std::string> key_from;  ///< inclusive
  std::optional<std::string> key_to;    ///< exclusive
  int64_t from = 0;                     ///< windows overlapping [from, to), ms since the epoch
  int64_t to = 0;
  /// Windows per page; 0: query.default_limit. At most query.max_limit.
  uint32_t limit = 0;
  /// The `next` of the previous page; empty: the first page.
  std::string cursor;
};

/// One window of one key.
struct key_window {
  std::string key;  ///< the group key
  window_value window;
  int32_t partition = -1;
};

/// One page of windows: by key (serialized byte order), then window start.
struct windows_page {
  std::vector<key_window> entries;
  std::optional<std::string> next;  ///< cursor of the next page; nullopt: the last page
  position pos;
};

// ---------------------------------------------------------------------------------
// Change listeners.
// ---------------------------------------------------------------------------------

/// One key's change as this node applied it (as the owner of its partition).
struct change {
  std::string store;
  int32_t partition = -1;
  std::string key;                       ///< an aggregate's group key
  std::optional<int64_t> window_start;   ///< windowed stores: the window
  std::optional<std::string> old_value;  ///< nullopt: was absent
  std::optional<std::string> new_value;  ///< nullopt: deleted
  int64_t offset = -1;                   ///< the record that wrote new_value (-1: a delete)
  int64_t next_offset = -1;              ///< the partition's position once this change was applied
};

/// Options of a change listener.
struct listen_options {
  /// Changes held for the listener at most; when full, the node's ingest waits for it.
  std::size_t max_queued = 10'000;
};

/// What a change stream follows, and from where (GET .../changes over HTTP).
struct changes_options {
  /// These keys; when empty, the keys with `prefix` and in [from, to) (all when unset).
  std::vector<std::string> keys;
  std::optional<std::string> prefix, from, to;
  /// Per partition followed, the next offset to read (an answer's or an event's
  /// position); empty: from the end of each partition now. When given, it must cover
  /// every partition followed (every partition of the topic, or those of `keys`).
  position from_position;
};

/// One change read from a view's history: for a table view, a record of its topic (key
/// and value as produced; nullopt: a deletion); for an aggregate view, an update of
/// its changelog (the group key and the new aggregate, JSON).
struct feed_event {
  std::string key;
  std::optional<std::string> value;
  int32_t partition = -1;
  /// The record's offset in the history read: the table's topic, or the aggregate's
  /// changelog.
  int64_t offset = -1;
  int64_t timestamp = -1;  ///< the record's timestamp, ms since the epoch (-1: none)
  /// The position this change completes: a stream opened from it gets every later
  /// change once. Positions of an aggregate's stream are changelog positions.
  position pos;
  /// Aggregates: the store-topic offset of the last record folded into the update (as
  /// answers report it; -1 when the changelog record does not say). Tables: `offset`.
  int64_t source_offset = -1;
  /// Windowed views: the start of the updated window.
  std::optional<int64_t> window_start;
  /// Session windows: the time of the session's last record (none for a session merged
  /// away, which is a deletion).
  std::optional<int64_t> session_last;
};

/// The changes of a view from a position on, read from its history (a table's topic, an
/// aggregate's changelog), so on any node, whoever owns the partitions. Not
/// thread-safe: one thread reads a stream.
class change_stream {
 public:
  change_stream();
  ~change_stream();
  change_stream(change_stream&&) noexcept;
  change_stream& operator=(change_stream&&) noexcept;
  /// The changes that come within `wait` (at most `max`), in each partition's order.
  /// not_found when the topic no longer holds the changes after the stream's position
  /// (retention deleted them): read the current values and follow from their position.
  result<std::vector<feed_event>> next(std::chrono::milliseconds wait, size_t max = 1'000);
  /// Where the stream is: every change before it was returned or is not followed.
  position pos() const;

  /// The library's own state of a stream (not part of the API).
  struct impl;

 private:
  friend class node;
  explicit change_stream(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

class node;

/// A subscription to a store's changes. Destroying it (or node::stop()) ends it: the
/// changes already queued are delivered first, then the thread ends.
class subscription {
 public:
  subscription();
  ~subscription();
  subscription(subscription&&) noexcept;
  subscription& operator=(subscription&&) noexcept;
  /// Stops delivering: queued changes are delivered, then the listener's thread is
  /// joined. Idempotent. Never call it from the callback.
  void cancel();
  /// Changes delivered so far.
  uint64_t delivered() const;

  /// The library's own state of a subscription (not part of the API).
  struct impl;

 private:
  friend class node;
  explicit subscription(std::shared_ptr<impl> i);
  std::shared_ptr<impl> impl_;
};

/// One kstate instance inside the application.
class node {
 public:
  /// Checks the options exactly as the YAML file would be checked; the error names
  /// the key at fault ("views[0].group_by: ..."). Nothing is started.
  static result<std::unique_ptr<node>> create(node_options options);
  ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  /// Opens the state, joins the group and starts consuming (and serving HTTP when
  /// asked). Returns once consuming started; answers may be unavailable until each
  /// assigned partition caught up (ready()).
  status start();
  /// True when every partition assigned here caught up (what /readyz says).
  bool ready() const;
  /// Non-empty when ingest stopped on an unrecoverable error.
  std::string fatal_error() const;
  /// Ends pending waits, cancels every subscription (queued changes delivered first),
  /// stops ingest, writes pending state and closes it. Queries called after it fail
  /// with unavailable. Idempotent; also done by the destructor.
  void stop();

  /// The REST endpoint other instances reach this node at.
  std::string endpoint() const;
  /// The HTTP port bound (0 when serve_http is false).
  uint16_t http_port() const;

  /// The latest value of a key.
  result<key_result> get(const std::string& store, const std::string& key, const read_options& o = {}) const;
  /// Many keys at once (at most query.max_batch_keys).
  result<multi_result> get_many(const std::string& store, const std::vector<std::string>& keys,
                                const read_options& o = {}) const;
  /// One page of a range of keys.
  result<range_page> range(const std::string& store, const range_options& r, const read_options& o = {}) const;
  /// The number of keys of a store.
  result<count_result> count(const std::string& store, const read_options& o = {}) const;
  /// The windows of a key of a windowed store overlapping [from, to) (ms since the
  /// epoch).
  result<windows_result> windows(const std::string& store, const std::string& key, int64_t from, int64_t to,
                                 const read_options& o = {}) const;
  /// One page of the windows of a range of keys of a windowed store, across every
  /// partition (takes no min_position, as over HTTP).
  result<windows_page> windows_range(const std::string& store, const windows_range_options& r,
                                     const read_options& o = {}) const;
  /// The current position of a store's partitions held here.
  result<position> current_position(const std::string& store) const;

  /// A stream of a view's changes from `o.from_position` (the REST API's change
  /// subscriptions, in process; an aggregate's positions are changelog positions):
  /// invalid_argument for a position that misses a followed partition or lies past a
  /// partition's end, not_found when the history no longer holds the changes after it.
  result<change_stream> changes(const std::string& store, const changes_options& o = {}) const;

  /// Calls `on_change` on a thread of the subscription's own for every change this
  /// node applies to `store` from now on, in each partition's order. Back-pressure:
  /// when `max_queued` changes wait, the node's ingest waits for the callback. The
  /// callback must not call stop() or cancel(). Exceptions it throws are logged and
  /// the next change is delivered.
  result<subscription> listen(const std::string& store, std::function<void(const change&)> on_change,
                              listen_options o = {});

 private:
  struct impl;
  explicit node(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

}  // namespace kstate::embed
