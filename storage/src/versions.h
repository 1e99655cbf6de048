#pragma once
// Versioned table views (internal to storage): how versions are laid out, placed on
// write, read back, and deleted once they leave the history.
//
// Layout: the latest values in the view's own column family, the versions in a column
// family of their own, "<view>#versions" (view names never contain '#'):
//   latest value  = partition (4 bytes) ++ key          (as every table view: plain reads
//                                                        are unchanged, and the view's
//                                                        files hold latest values only)
//   version       = (partition | 0x80000000) (4 bytes) ++ escaped key ++ 0x00 0x01
//                   ++ ~(valid_from ^ sign bit) (8 bytes, big-endian)
//                -> kind (1 byte: 0 value, 1 tombstone) ++ valid_to (8 bytes, big-endian,
//                   INT64_MAX while still valid) ++ offset frame (8 bytes) ++ value bytes
// The prefix's top bit marks a version key wherever it is found (a copy of a partition
// sends both kinds in one stream, latest values first, since they sort first). The key
// is escaped (0x00 -> 0x00 0xFF) and terminated by 0x00 0x01, so versions sort by key
// bytes exactly as the keys do, each key's versions are contiguous, newest first.
// The latest version is kept in both places: plain reads pay nothing for the history,
// and as-of reads read versions only.

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <rocksdb/compaction_filter.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include "core/status.h"
#include "storage/db.h"

namespace kstate::storage {

inline constexpr uint32_t version_partition_bit = 0x80000000u;
// A versioned view's versions live in the column family named after it with this suffix.
inline constexpr const char* versions_cf_suffix = "#versions";
inline constexpr int64_t still_valid = INT64_MAX;
inline constexpr size_t version_header = 1 + 8;  // kind + valid_to, before the offset frame

// The earliest time a partition at `stream_time` answers for (saturating).
inline int64_t history_start_at(int64_t stream_time, int64_t history_ms) noexcept {
  return stream_time < INT64_MIN + history_ms ? INT64_MIN : stream_time - history_ms;
}

// The prefix of partition `partition`'s versions.
std::string version_prefix(int32_t partition);
// The versions of `key` start with version_prefix(p) ++ version_group(key).
std::string version_group(std::string_view key);
// A version's key: prefix, group, then its valid_from.
std::string version_key(int32_t partition, std::string_view key, int64_t valid_from);
void append_time_desc(std::string& out, int64_t t);
int64_t time_desc(std::string_view eight);

struct decoded_version_key {
  std::string_view group;  // version_prefix ++ version_group(key): the key's versions share it
  int64_t valid_from;
};
// `full`: a stored version key. nullopt when it is not one.
std::optional<decoded_version_key> decode_version_key(std::string_view full);
// The record key of a version_group (without the prefix); false when malformed.
bool unescape_group(std::string_view group_without_prefix, std::string& key);

struct decoded_version_value {
  bool tombstone;
  int64_t valid_to;
  std::string_view stored;  // offset frame ++ value bytes: what get() returns for a value
};
std::optional<decoded_version_value> decode_version_value(std::string_view v);
std::string encode_version_value(bool tombstone, int64_t valid_to, std::string_view stored);

// One versioned view: its history, its partitions' stream times as last written, and
// what its compaction filter and writes dropped.
struct versioned_state {
  int64_t history_ms = 0;
  std::string stream_time_position;
  // The view's versions column family ("<view>#versions"); set once at open.
  rocksdb::ColumnFamilyHandle* cf = nullptr;
  std::atomic<uint64_t> expired{0};
  std::atomic<uint64_t> late{0};
  mutable std::mutex mu;
  std::map<int32_t, int64_t> stream_time;  // guarded by mu
};

// The compaction filter factory of a versioned view: every compaction deletes the
// versions that ended at or before their partition's stream time minus the history, at
// the stream times `state` holds when it starts. Latest values are never touched.
std::shared_ptr<rocksdb::CompactionFilterFactory> make_version_filter_factory(std::shared_ptr<versioned_state> state);

// One put_version() call, kept in the write_batch until db::write() places it.
struct pending_version {
  view_id view;
  int32_t partition;
  int64_t timestamp;
  int64_t offset;
  bool tombstone;
  uint32_t key_at, key_size, value_at, value_size;  // in the batch's arena
};

// A stream time db::write() publishes to `state` once the write succeeded.
struct published_stream_time {
  versioned_state* state;
  int32_t partition;
  int64_t time;
};

// Places `pending` (in order) into `out`: each version, the neighbour whose validity it
// cuts short, the latest value when it is the newest, and the stream time. Reads the
// database as it stands (the caller is the partition's only writer). Appends the stream
// times to publish after the write to `publish`.
status place_versions(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* meta,
                      const std::vector<rocksdb::ColumnFamilyHandle*>& views,
                      const std::vector<std::string>& view_names,
                      const std::map<view_id, std::shared_ptr<versioned_state>>& versioned,
                      const std::vector<pending_version>& pending, std::string_view arena, rocksdb::WriteBatch& out,
                      std::vector<published_stream_time>& publish);

}  // namespace kstate::storage
