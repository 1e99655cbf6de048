// Reads of versioned views through a snapshot: the version valid at a time, the versions
// overlapping an interval, and a cursor over the keys as they were at a time.

#include "version_reads.h"

#include <rocksdb/options.h>

#include "core/value_codec.h"
#include "db_impl.h"
#include "storage/key_codec.h"

namespace kstate::storage {

namespace {

version to_version(const decoded_version_key& k, const decoded_version_value& v) {
  version out;
  out.valid_from = k.valid_from;
  if (v.valid_to != still_valid) out.valid_to = v.valid_to;
  if (!v.tombstone) out.value = std::string(v.stored);
  if (auto f = unframe_value(v.stored)) out.offset = f->offset;
  return out;
}

rocksdb::ReadOptions read_options(const rocksdb::Snapshot* snap, bool fill_cache = true) {
  rocksdb::ReadOptions ro;
  ro.snapshot = snap;
  ro.fill_cache = fill_cache;
  return ro;
}

// Past every version of the group `group` (which ends in 0x00 0x01): a version key is
// the group and 8 bytes, so 9 bytes of 0xFF sort after all of them and before the next
// group.
std::string past_group(std::string_view group) {
  std::string out(group);
  out.append(9, '\xff');
  return out;
}

// The keys of one partition as they were at a time: for each key (group of versions) in
// the bounds, the newest version with valid_from <= time, skipped when it is a tombstone
// or ended by then. One iterator, moved by seeks: a key with many versions costs a seek,
// not a walk over them.
class as_of_cursor final : public partition_cursor {
 public:
  as_of_cursor(rocksdb::DB* rdb, rocksdb::ColumnFamilyHandle* cf, const rocksdb::Snapshot* snap, int64_t time,
               bool descending, scan_use use)
      : time_(time), descending_(descending) {
    it_.reset(rdb->NewIterator(read_options(snap, use == scan_use::page), cf));
  }

  void seek(int32_t partition, const std::optional<std::string>& lower,
            const std::optional<std::string>& upper) override {
    begin_ = version_prefix(partition);
    if (lower) begin_ += version_group(*lower);
    if (upper) {
      end_ = version_prefix(partition) + version_group(*upper);
    } else if (partition == INT32_MAX) {
      end_ = std::string(5, '\xff');
    } else {
      end_ = version_prefix(partition + 1);
    }
    if (!descending_) {
      it_->Seek(begin_);
    } else {
      it_->SeekForPrev(end_);
      if (it_->Valid() && it_->key() == rocksdb::Slice(end_)) it_->Prev();
    }
    settle();
  }
  bool valid() const override { return found_; }
  std::string_view key() const override { return key_; }
  std::string_view value() const override { return value_; }
  void next() override {
    if (!found_) return;
    found_ = false;
    leave_group();
    settle();
  }
  status error() const override { return from_rocks(it_->status(), "scan as of a time"); }

 private:
  bool in_bounds() const {
    if (!it_->Valid()) return false;
    auto k = it_->key();
    return k.compare(rocksdb::Slice(begin_)) >= 0 && k.compare(rocksdb::Slice(end_)) < 0;
  }
  // Moves to the next group in the cursor's order.
  void leave_group() {
    if (descending_) it_->SeekForPrev(group_);  // the group itself is no key: the one before it
    else it_->Seek(past_group(group_));
  }
  // From any version of a group onwards, the first group with a value at time_.
  void settle() {
    found_ = false;
    while (in_bounds()) {
      auto k = decode_version_key(std::string_view(it_->key().data(), it_->key().size()));
      if (!k) {  // not a version: never written by kstate; stepped over
        if (descending_) it_->Prev();
        else it_->Next();
        continue;
      }
      group_.assign(k->group);
      std::string target = group_;
      append_time_desc(target, time_);
      it_->Seek(target);
      if (it_->Valid() && it_->key().starts_with(rocksdb::Slice(group_))) {
        auto v = decode_version_value(std::string_view(it_->value().data(), it_->value().size()));
        if (v && !v->tombstone && v->valid_to > time_ && unescape_group(std::string_view(group_).substr(4), key_)) {
          value_ = v->stored;
          found_ = true;
          return;
        }
      }
      leave_group();
    }
  }

  int64_t time_;
  bool descending_;
  std::unique_ptr<rocksdb::Iterator> it_;
  std::string begin_, end_;
  std::string group_;  // the group the iterator is in
  bool found_ = false;
  std::string key_;
  std::string_view value_;  // into the iterator's current value
};

// A partition's stored versions, raw (keys without their 4-byte prefix).
class raw_versions final : public partition_iterator {
 public:
  raw_versions(rocksdb::DB* rdb, rocksdb::ColumnFamilyHandle* cf, const rocksdb::Snapshot* snap, int32_t partition)
      : lower_(version_prefix(partition)),
        upper_(partition == INT32_MAX ? std::string(5, '\xff') : version_prefix(partition + 1)) {
    lower_slice_ = rocksdb::Slice(lower_);
    upper_slice_ = rocksdb::Slice(upper_);
    auto ro = read_options(snap, false);
    ro.iterate_lower_bound = &lower_slice_;
    ro.iterate_upper_bound = &upper_slice_;
    it_.reset(rdb->NewIterator(ro, cf));
    it_->SeekToFirst();
  }
  bool valid() const override { return it_->Valid(); }
  std::string_view key() const override { return std::string_view(it_->key().data() + 4, it_->key().size() - 4); }
  std::string_view value() const override { return std::string_view(it_->value().data(), it_->value().size()); }
  void next() override { it_->Next(); }
  status error() const override { return from_rocks(it_->status(), "scan of versions"); }

 private:
  std::string lower_, upper_;
  rocksdb::Slice lower_slice_, upper_slice_;
  std::unique_ptr<rocksdb::Iterator> it_;
};

}  // namespace

result<std::optional<int64_t>> read_history_start(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* meta,
                                                  const rocksdb::Snapshot* snap, const versioned_state& state,
                                                  int32_t partition) {
  std::string v;
  auto s = rdb.Get(read_options(snap), meta, encode_position_key(state.stream_time_position, partition), &v);
  if (s.IsNotFound()) return std::optional<int64_t>();
  if (!s.ok()) return from_rocks(s, "reading the stream time");
  auto t = decode_offset(v);
  if (!t) return status::corruption("stream time record has " + std::to_string(v.size()) + " bytes");
  return std::optional<int64_t>(history_start_at(*t, state.history_ms));
}

result<std::optional<version>> read_version_at(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* cf,
                                               const rocksdb::Snapshot* snap, int32_t partition, std::string_view key,
                                               int64_t time) {
  const std::string target = version_key(partition, key, time);
  const std::string_view group(target.data(), target.size() - 8);
  std::unique_ptr<rocksdb::Iterator> it(rdb.NewIterator(read_options(snap), cf));
  it->Seek(target);
  if (!it->Valid() || !it->key().starts_with(rocksdb::Slice(group.data(), group.size()))) {
    if (auto s = from_rocks(it->status(), "reading a version"); !s.ok()) return s;
    return std::optional<version>();
  }
  auto k = decode_version_key(std::string_view(it->key().data(), it->key().size()));
  auto v = decode_version_value(std::string_view(it->value().data(), it->value().size()));
  if (!k || !v) return status::corruption("a stored version of a key cannot be decoded");
  if (v->valid_to <= time) return std::optional<version>();
  return std::optional<version>(to_version(*k, *v));
}

result<std::vector<version>> read_versions(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* cf,
                                           const rocksdb::Snapshot* snap, int32_t partition, std::string_view key,
                                           int64_t from, int64_t to, int64_t not_before, size_t limit) {
  std::vector<version> out;
  if (to <= from || limit == 0) return out;
  // The newest version that began before `to`, then older ones, until one ended at or
  // before `from` (every older one did too).
  const std::string target = version_key(partition, key, to - 1);
  const std::string group(target.data(), target.size() - 8);
  std::unique_ptr<rocksdb::Iterator> it(rdb.NewIterator(read_options(snap), cf));
  for (it->Seek(target); it->Valid() && it->key().starts_with(rocksdb::Slice(group)) && out.size() < limit;
       it->Next()) {
    auto k = decode_version_key(std::string_view(it->key().data(), it->key().size()));
    auto v = decode_version_value(std::string_view(it->value().data(), it->value().size()));
    if (!k || !v) return status::corruption("a stored version of a key cannot be decoded");
    if (v->valid_to <= from || v->valid_to <= not_before) break;
    out.push_back(to_version(*k, *v));
  }
  if (auto s = from_rocks(it->status(), "reading versions"); !s.ok()) return s;
  return out;
}

std::unique_ptr<partition_cursor> make_as_of_cursor(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* cf,
                                                    const rocksdb::Snapshot* snap, int64_t time, bool descending,
                                                    scan_use use) {
  return std::make_unique<as_of_cursor>(&rdb, cf, snap, time, descending, use);
}

std::unique_ptr<partition_iterator> make_version_scan(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* cf,
                                                      const rocksdb::Snapshot* snap, int32_t partition) {
  return std::make_unique<raw_versions>(&rdb, cf, snap, partition);
}

}  // namespace kstate::storage
