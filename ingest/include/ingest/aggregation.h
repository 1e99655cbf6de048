#pragma once
// The per-view logic of aggregate views, without Kafka or RocksDB: deriving group keys
// from a record, and folding a record's value into a key's aggregate.
//
// An aggregate's state is the JSON text that is stored, changelogged and served (a
// number for count/sum/reduce, an object for aggregate), so restoring a key from the
// changelog is a plain put. A window dimension would extend the group key (key ++
// window start), not this interface.
//
// Thread safety: aggregator is immutable after construction; share it freely.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/view.h"

namespace kstate::ingest {

// The words of a line (UTF-8 text): the longest runs of code points whose Unicode
// general category is a letter, number, mark or connector punctuation (\p{L}, \p{N},
// \p{M}, \p{Pc}), each lower-cased with Unicode's full lower-case mapping in the root
// locale (ICU: "STRASSE" -> "strasse", "Straße" -> "straße", "ΟΔΟΣ" -> "οδος" with a
// final sigma, "İ" -> "i" + U+0307). No normalization, no segmentation of scripts
// written without spaces. On ASCII these are the runs of [A-Za-z0-9_], lower-cased,
// and ICU is not called. Ill-formed UTF-8 sequences separate words (group_keys refuses
// such values before splitting). docs/configuration.md#words has the user's version.
std::vector<std::string> split_words(std::string_view line);

// Why a group key is refused by the view: with key_format json, a key nested deeper
// than `max_json_depth` (it is rendered as JSON). Empty: accepted.
std::string check_group_key(const view_def& view, std::string_view key, int max_json_depth);

// The group keys of a record for a view (one for group_by key/json, one per word for
// words), appended to `out`. Empty string: derived; otherwise why the record has none.
// JSON values are checked against `max_json_depth` before they are parsed.
std::string group_keys(const view_def& view, std::optional<std::string_view> key, std::optional<std::string_view> value,
                       int max_json_depth, std::vector<std::string>& out);

// The event time of a record for a windowed view: the JSON field window.time_field
// (epoch ms or ISO-8601) when set, else the record timestamp. Empty string: `out` is
// set; otherwise why the record has none.
std::string event_time(const view_def& view, std::optional<std::string_view> value, int64_t record_timestamp,
                       int max_json_depth, int64_t& out);

// Why a windowed view refuses event time `ts` when the wall clock reads `now_ms`: it
// is more than window.max_future ahead (beyond_max_future, core/window.h). Empty:
// accepted (and always for views without a window).
std::string check_future(const view_def& view, int64_t ts, int64_t now_ms);

// A number of an aggregate, exact while it is an integer that fits in 64 bits.
struct agg_number {
  bool integer = true;
  int64_t i = 0;
  double d = 0;
};

// What the records of one batch add up to for one group key of one view, before they
// are re-keyed (map-side combining): a re-keyed view sends one repartition record per
// key and batch holding this, instead of one per source record. For count, sum, reduce
// and aggregate views that are not windowed (a windowed view folds each record into
// the windows of its own event time).
struct partial_aggregate {
  int64_t count = 0;
  std::optional<agg_number> sum, min, max, latest;
  int64_t timestamp = -1;  // the latest record timestamp combined
};

// A repartition record's value that holds a partial_aggregate starts with this byte,
// which cannot begin a JSON text: a record from a kstate that did not combine (its
// source record's value, or none for words) is told apart and folded as before.
inline constexpr char partial_marker = '\x01';
inline bool is_partial(std::optional<std::string_view> value) {
  return value && !value->empty() && value->front() == partial_marker;
}

class aggregator {
 public:
  // Values are checked against `max_json_depth` before they are parsed.
  aggregator(const view_def& view, int max_json_depth);

  // Why `value` cannot be folded into this view (e.g. not a number for sum), or empty.
  std::string check(std::optional<std::string_view> value) const;

  struct outcome {
    std::string state;  // the new aggregate (JSON text) when error is empty
    std::string error;
  };
  // Folds `value` into `current` (nullopt: the key has no aggregate yet). A value that
  // is_partial() is merged as the records it stands for.
  outcome apply(std::optional<std::string_view> current, std::optional<std::string_view> value) const;

  // The aggregate of the records of two aggregates together: what folding every record
  // of `older` and then every record of `newer` gives (two sessions merged into one).
  // Counts and sums add up (exact while integers fit in 64 bits), min and max compare,
  // mean is derived again from the merged count and sum, reduce latest keeps `newer`'s.
  // An error says a stored aggregate is not what this view writes.
  outcome merge(std::string_view older, std::string_view newer) const;

  // Adds a source record's value (and timestamp) to `p`. Empty: added; otherwise why the
  // value cannot be aggregated (as check() says).
  std::string combine(partial_aggregate& p, std::optional<std::string_view> value, int64_t timestamp) const;
  // The repartition record's value of `p`: partial_marker, then JSON.
  std::string encode(const partial_aggregate& p) const;

 private:
  view_def view_;
  int max_json_depth_;
};

}  // namespace kstate::ingest
