#pragma once
// The per-view logic of foreign-key join views, without Kafka or RocksDB
// (docs/fk-joins.md): the foreign key of a left value, the records of the view's two
// internal topics, the rows each side keeps, and the transitions that turn one input
// record into row changes and records to send.
//
// Two sides, two topics:
// - the left side lives in partition p of the view's repartition topic (p: the left
//   record's partition); it keeps per left key a fk_left_row and writes the joined
//   value. It receives copies of the left records and responses.
// - the right side lives in partition q = murmur2(foreign key) of the view's
//   subscription topic; it keeps per foreign key the right value and the left keys
//   that subscribe to it. It receives copies of the right records, subscriptions and
//   unsubscriptions.
// A subscription carries a version: the repartition offset of the left record that
// made it. A response carries the version of the subscription it answers, and the
// left side applies only a response whose version is the row's current one, so a late
// response for an old foreign key never overwrites the result of the new one.
//
// Thread safety: pure functions and immutable values; share them freely.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/view.h"
#include "ingest/join.h"

namespace kstate::ingest {

// What a left value refers to: the right key its foreign-key field names, or nothing
// (no row for inner, a row without a match for left). A string field is the key's
// bytes (key_format string) or its JSON text (key_format json); a number is its JSON
// text ("42", "1.5"); anything else (missing, null, bool, object, array) refers to
// nothing. `why` (optional) says which, for the counter's reason.
std::optional<std::string> foreign_key_of(std::string_view left_value, std::string_view path, data_format key_format,
                                          int max_json_depth, std::string* why = nullptr);

// --- records of the subscription topic (keyed by the foreign key, or the right key) ---
inline constexpr char fk_right_marker = '\x04';
inline constexpr char fk_subscribe_marker = '\x05';
inline constexpr char fk_unsubscribe_marker = '\x06';
// --- records of the repartition topic (keyed by the left key) ---
// A copy of a left record uses join_left_marker (ingest/join.h); a response this one.
inline constexpr char fk_response_marker = '\x07';

enum class fk_message_kind : uint8_t { right, subscribe, unsubscribe, response };

// One decoded record of either internal topic. Which fields mean something depends on
// `kind`: right (value: the right value, nullopt a tombstone), subscribe (left_key,
// left_partition, version), unsubscribe (left_key, version: drop subscriptions older
// than it), response (version, value: the right value, nullopt none).
struct fk_message {
  fk_message_kind kind = fk_message_kind::right;
  std::string left_key;
  int32_t left_partition = 0;
  int64_t version = -1;
  std::optional<std::string> value;
  bool operator==(const fk_message&) const = default;
};

std::string encode_fk_message(const fk_message& m);
// nullopt when `bytes` is not such a record (wrong marker, truncated, negative numbers).
std::optional<fk_message> decode_fk_message(std::string_view bytes);

// A left key's row on the left side.
struct fk_left_row {
  std::optional<std::string> left;   // the latest left value; nullopt: none (deleted)
  std::optional<std::string> fk;     // its foreign key; nullopt: refers to nothing
  int64_t version = -1;              // the current subscription's version (fk set)
  bool answered = false;             // a response of `version` arrived: `right` is known
  std::optional<std::string> right;  // the right value of `fk` as last answered
  bool empty() const noexcept { return !left; }
  bool operator==(const fk_left_row&) const = default;
};
// Stored and changelogged form; an empty row encodes to the empty string (a deletion).
std::string encode_fk_left_row(const fk_left_row& r);
std::optional<fk_left_row> decode_fk_left_row(std::string_view bytes);

// A subscription kept on the right side, under (foreign key, left key).
struct fk_subscription {
  int32_t left_partition = 0;
  int64_t version = -1;
  bool operator==(const fk_subscription&) const = default;
};
std::string encode_fk_subscription(const fk_subscription& s);
std::optional<fk_subscription> decode_fk_subscription(std::string_view bytes);

// Keys of the right side's column family: a right value under fk_right_key(fk), the
// subscriptions of fk under fk_subscription_prefix(fk) + left key. The length prefix
// keeps one foreign key's subscriptions apart from a longer one's.
std::string fk_right_key(std::string_view fk);
std::string fk_subscription_prefix(std::string_view fk);

// A record the left side sends to the subscription topic: `key` (the foreign key) goes
// to partition murmur2(key) of that topic.
struct fk_outgoing {
  std::string key;
  fk_message message;
};

// What the left side does with a left record: the row's new state, and the records to
// send (an unsubscription of the old foreign key, a subscription of the new one).
struct fk_left_step {
  fk_left_row row;
  std::vector<fk_outgoing> send;
};
// `value` nullopt: a tombstone. `version`: the record's repartition offset (grows with
// every left record of the key). `fk`: foreign_key_of(value), computed by the caller.
fk_left_step fk_apply_left(fk_left_row row, std::string_view left_key, int32_t left_partition,
                           std::optional<std::string_view> value, std::optional<std::string> fk, int64_t version);
// A response for the row: applied when its version is the row's subscription; false
// (the row unchanged) when it is stale, answering a subscription the row has left.
bool fk_apply_response(fk_left_row& row, int64_t version, std::optional<std::string_view> right);

// The row's view as a key join sees it: the left value, and the right value when the
// foreign key's answer is known. A row waiting for its first answer after a change of
// foreign key has no joined value yet (a left join does not show a null match that may
// not be one); a left value that refers to nothing joins no right value.
join_sides fk_sides(const fk_left_row& row);

// A response to send to the left side, from the right side: to partition
// `left_partition` of the repartition topic, keyed by the left key.
struct fk_response {
  std::string left_key;
  int32_t left_partition = 0;
  fk_message message;
};

}  // namespace kstate::ingest

namespace kstate::ingest {

// The right side's transitions. A subscription: kept unless an equal or newer one of
// the same left key is (a replay), and answered with the foreign key's current right
// value. nullopt: ignored.
std::optional<fk_subscription> fk_apply_subscribe(const std::optional<fk_subscription>& existing,
                                                  const fk_message& subscribe);
fk_response fk_answer(std::string_view left_key, const fk_subscription& s, const std::optional<std::string>& right);
// An unsubscription removes the left key's subscription when it is older than the one
// the unsubscription was sent for (a newer one, of a return to this foreign key, stays).
bool fk_unsubscribe_removes(const std::optional<fk_subscription>& existing, const fk_message& unsubscribe);

}  // namespace kstate::ingest
