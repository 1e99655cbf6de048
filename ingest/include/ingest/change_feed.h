#pragma once
// change_feed: the changes a view applies, read again from the topic that records
// them, for change subscriptions (GET /v1/stores/{store}/changes).
//
// A table view applies every record of its topic that it accepts, in each partition's
// order: the record that an accepted record at offset o writes is the change that
// takes the partition's position from o to o + 1. So the topic itself is the history
// of the view's changes, and a position (partition -> next offset) names a point in it
// exactly: reading on from a position gives every later change once, in order, on any
// instance, whoever owns the partitions and through any rebalance. Records the view
// rejects (validate(), as ingest decides) are no change. When the topic no longer
// holds the offsets a position needs (retention deleted them), the feed says so
// (not_found) instead of skipping ahead.
//
// An aggregate view writes every update of its state to its changelog topic (the topic
// its restores read), so its changes are the changelog's records, and its positions
// are changelog positions: feed_topic() names the topic whose offsets the positions
// count. A windowed view's changelog key is the (group key, window start) pair its
// state is stored under; the selection applies to the group key.
//
// Thread safety: none; one thread polls a feed at a time.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/view.h"
#include "ingest/engine.h"

namespace kstate::ingest {

// The keys a subscription follows: these keys, or those with the prefix and in
// [from, to) (serialized bytes; every bound optional).
struct feed_selection {
  std::vector<std::string> keys;  // when not empty, only these
  std::optional<std::string> prefix, from, to;
  bool matches(std::string_view key) const;
};

// One change: the record that made it, its key and its value (nullopt: a deletion).
struct feed_change {
  int32_t partition = 0;
  int64_t offset = 0;  // of the record in feed_topic()
  std::string key;     // the group key of a windowed view
  std::optional<std::string> value;
  int64_t timestamp = -1;  // the record's timestamp, ms since the epoch (-1: none)
  // Aggregate views: the offset, in the view's store topic, of the last record folded
  // into this update (as answers report it). Tables: `offset`.
  int64_t source_offset = -1;
  // Windowed views: the start of the updated window.
  std::optional<int64_t> window_start;
  // Session windows: the time of the session's last record (a deletion: none).
  std::optional<int64_t> session_last;
};

// The topic whose records are a view's changes: a table's topic, an aggregate's
// changelog.
const std::string& feed_topic(const view_def& view);

// How a feed starts and what its polls report.
struct feed_options {
  // Every partition from the first offset its topic still holds (the values given in
  // `start` are ignored): a replay of the history the topic keeps.
  bool from_beginning = false;
  // A poll returns as soon as a partition reaches the end of what the topic holds
  // (read committed: its last stable offset), which caught_up() then names, and the
  // partition's position moves to that end (past transaction markers).
  bool report_end = false;
};

class change_feed {
 public:
  // Reads feed_topic(view) on the partitions of `start`, each from its offset (the next
  // one to read), or from the end of the partition as it is now when nullopt. Checks
  // the offsets against what the topic holds: one before the partition's first offset
  // is not_found (the history is gone), one past its end invalid_argument.
  // The client's properties are the source consumer's (cfg.kafka, security included),
  // reading committed records only, without a group.
  static result<std::unique_ptr<change_feed>> open(const ingest_config& cfg, const view_def& view,
                                                   const std::map<int32_t, std::optional<int64_t>>& start,
                                                   int max_json_depth, const feed_options& options = {});
  ~change_feed();
  change_feed(const change_feed&) = delete;
  change_feed& operator=(const change_feed&) = delete;

  // Waits up to `wait` for a change of `sel`, then takes what is already fetched (up
  // to `max` changes or `max_bytes` of keys and values) and returns those changes. position() moves
  // past every record read, matching or not. not_found when the topic lost
  // the offsets the position needs meanwhile.
  result<std::vector<feed_change>> poll(const feed_selection& sel, std::chrono::milliseconds wait, size_t max,
                                        size_t max_bytes);

  // Per partition read, the next offset: every change before it was returned (or did
  // not match), none after it.
  const std::map<int32_t, int64_t>& position() const;
  // With feed_options::report_end: the partitions that reached the end of their topic
  // partition at least once. Every change returned by a poll before a partition joined
  // this set was before that end.
  const std::set<int32_t>& caught_up() const;
  // Per partition, the largest record timestamp read (selected or not); a windowed
  // view's changelog timestamps are event times, so this is the stream time its state
  // reached (as its restores recover it).
  const std::map<int32_t, int64_t>& max_timestamps() const;

  struct impl;

 private:
  explicit change_feed(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

}  // namespace kstate::ingest
