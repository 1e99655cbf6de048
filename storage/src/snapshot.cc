// Snapshots and their partition iterators: every read through one snapshot sees the
// database at one instant, whatever ingest writes meanwhile.

#include <rocksdb/options.h>

#include <tuple>

#include "db_impl.h"
#include "version_reads.h"
#include "storage/key_codec.h"

namespace kstate::storage {
namespace {

// Encoded bounds of the keys k of `partition` with lower <= k < upper: [begin, end).
std::pair<std::string, std::string> partition_bounds(int32_t partition, const std::optional<std::string>& lower,
                                                     const std::optional<std::string>& upper) {
  std::string begin = encode_data_key(partition, lower.value_or(std::string()));
  std::string end = upper ? encode_data_key(partition, *upper) : encode_data_key(partition + 1, {});
  // After the last partition come versioned views' versions (their prefix has the top
  // bit set): a plain read of it stops before them.
  if (partition == INT32_MAX && !upper) end = std::string("\x80\x00\x00\x00", 4);
  return {std::move(begin), std::move(end)};
}

// Which values of a view a snapshot's reads skip: those expired at `now` by the view's
// time to live (0: none, nothing is skipped).
struct expiry {
  int64_t ttl_ms = 0;
  int64_t now = 0;
  bool operator()(const rocksdb::Slice& v) const noexcept {
    return ttl_ms > 0 && value_expired(std::string_view(v.data(), v.size()), ttl_ms, now);
  }
};

class rocks_partition_iterator final : public partition_iterator {
 public:
  rocks_partition_iterator(rocksdb::DB* rdb, rocksdb::ColumnFamilyHandle* cf, const rocksdb::Snapshot* snap,
                           int32_t partition, const std::optional<std::string>& lower,
                           const std::optional<std::string>& upper, bool descending, scan_use use, expiry expired)
      : descending_(descending), expired_(expired) {
    // Bounds in encoded space: the partition prefix keeps iteration inside the partition.
    std::tie(lower_, upper_) = partition_bounds(partition, lower, upper);
    lower_slice_ = rocksdb::Slice(lower_);
    upper_slice_ = rocksdb::Slice(upper_);
    rocksdb::ReadOptions ro;
    ro.snapshot = snap;
    ro.iterate_lower_bound = &lower_slice_;
    ro.iterate_upper_bound = &upper_slice_;
    // A sweep of a whole store would evict the lookups' working set from the shared
    // cache; a page reads few blocks, which the next page or scan of the range reads again.
    ro.fill_cache = use == scan_use::page;
    it_.reset(rdb->NewIterator(ro, cf));
    if (descending_) it_->SeekToLast();
    else it_->SeekToFirst();
    skip_expired();
  }
  bool valid() const override { return it_->Valid(); }
  std::string_view key() const override {
    auto k = it_->key();
    return std::string_view(k.data() + 4, k.size() - 4);
  }
  std::string_view value() const override {
    auto v = it_->value();
    return std::string_view(v.data(), v.size());
  }
  void next() override {
    step();
    skip_expired();
  }
  status error() const override { return from_rocks(it_->status(), "scan"); }

 private:
  void step() {
    if (descending_) it_->Prev();
    else it_->Next();
  }
  void skip_expired() {
    while (it_->Valid() && expired_(it_->value())) step();
  }

  bool descending_;
  expiry expired_;
  std::string lower_, upper_;
  rocksdb::Slice lower_slice_, upper_slice_;
  std::unique_ptr<rocksdb::Iterator> it_;
};

// One iterator without bounds, checked against each partition's bounds here: RocksDB's
// bounds are fixed when an iterator is made.
class rocks_partition_cursor final : public partition_cursor {
 public:
  rocks_partition_cursor(rocksdb::DB* rdb, rocksdb::ColumnFamilyHandle* cf, const rocksdb::Snapshot* snap,
                         bool descending, scan_use use, expiry expired)
      : descending_(descending), expired_(expired) {
    rocksdb::ReadOptions ro;
    ro.snapshot = snap;
    ro.fill_cache = use == scan_use::page;
    it_.reset(rdb->NewIterator(ro, cf));
  }
  void seek(int32_t partition, const std::optional<std::string>& lower,
            const std::optional<std::string>& upper) override {
    std::tie(begin_, end_) = partition_bounds(partition, lower, upper);
    if (!descending_) {
      it_->Seek(begin_);
    } else {
      // The last key before `end_`: at or before it, then one back when it is `end_`.
      it_->SeekForPrev(end_);
      if (it_->Valid() && it_->key() == rocksdb::Slice(end_)) it_->Prev();
    }
    skip_expired();
  }
  bool valid() const override {
    if (!it_->Valid()) return false;
    auto k = it_->key();
    return descending_ ? k.compare(rocksdb::Slice(begin_)) >= 0 : k.compare(rocksdb::Slice(end_)) < 0;
  }
  std::string_view key() const override {
    auto k = it_->key();
    return std::string_view(k.data() + 4, k.size() - 4);
  }
  std::string_view value() const override {
    auto v = it_->value();
    return std::string_view(v.data(), v.size());
  }
  void next() override {
    step();
    skip_expired();
  }
  status error() const override { return from_rocks(it_->status(), "scan"); }

 private:
  void step() {
    if (descending_) it_->Prev();
    else it_->Next();
  }
  // Stops at the partition's bounds too: what lies beyond them is not this seek's.
  void skip_expired() {
    while (valid() && expired_(it_->value())) step();
  }

  bool descending_;
  expiry expired_;
  std::string begin_, end_;
  std::unique_ptr<rocksdb::Iterator> it_;
};

// What a snapshot needs of the database; the db outlives its snapshots.
struct snapshot_parts {
  rocksdb::DB* rdb;
  rocksdb::ColumnFamilyHandle* meta;
  const std::vector<rocksdb::ColumnFamilyHandle*>* views;
  const std::vector<std::string>* view_names;
  const std::vector<int64_t>* ttl_ms;  // by view id; 0: no ttl
  const std::map<view_id, std::shared_ptr<versioned_state>>* versioned;
  int64_t now;  // the clock when the snapshot was taken
};

class rocks_snapshot final : public snapshot {
 public:
  explicit rocks_snapshot(const snapshot_parts& a) : a_(a), snap_(a.rdb->GetSnapshot()) {}
  ~rocks_snapshot() override { a_.rdb->ReleaseSnapshot(snap_); }

  // Positions of `partitions` of `view` known from memory (db::read_snapshot(view, ...)).
  void know(view_id view, std::vector<int32_t> partitions, std::vector<std::optional<int64_t>> positions) {
    known_view_ = view;
    known_partitions_ = std::move(partitions);
    known_ = std::move(positions);
  }

  result<std::optional<int64_t>> position(view_id view, int32_t partition) const override {
    if (known_view_ == view)
      for (std::size_t i = 0; i < known_partitions_.size(); ++i)
        if (known_partitions_[i] == partition) return known_[i];
    std::string v;
    auto s = a_.rdb->Get(options(), a_.meta, encode_position_key(a_.view_names->at(view), partition), &v);
    if (s.IsNotFound()) return std::optional<int64_t>();
    if (!s.ok()) return from_rocks(s, "reading position");
    auto off = decode_offset(v);
    if (!off) return status::corruption("position record has " + std::to_string(v.size()) + " bytes");
    return std::optional<int64_t>(*off);
  }

  result<std::vector<std::optional<int64_t>>> positions(view_id view,
                                                        const std::vector<int32_t>& partitions) const override {
    if (known_view_ == view && known_partitions_ == partitions) return known_;
    std::vector<std::string> keys;
    keys.reserve(partitions.size());
    for (int32_t p : partitions) keys.push_back(encode_position_key(a_.view_names->at(view), p));
    std::vector<rocksdb::Slice> slices(keys.begin(), keys.end());
    std::vector<rocksdb::PinnableSlice> values(keys.size());
    std::vector<rocksdb::Status> statuses(keys.size());
    a_.rdb->MultiGet(options(), a_.meta, slices.size(), slices.data(), values.data(), statuses.data());
    std::vector<std::optional<int64_t>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (statuses[i].IsNotFound()) continue;
      if (!statuses[i].ok()) return from_rocks(statuses[i], "reading positions");
      auto off = decode_offset(std::string_view(values[i].data(), values[i].size()));
      if (!off) return status::corruption("position record has " + std::to_string(values[i].size()) + " bytes");
      out[i] = *off;
    }
    return out;
  }

  result<std::optional<std::string>> get(view_id view, int32_t partition, std::string_view key) const override {
    std::string v;
    auto s = a_.rdb->Get(options(), a_.views->at(view), encode_data_key(partition, key), &v);
    if (s.IsNotFound() || (s.ok() && expired(view)(v))) return std::optional<std::string>();
    if (!s.ok()) return from_rocks(s, "get");
    return std::optional<std::string>(std::move(v));
  }

  result<std::vector<std::optional<std::string>>> multi_get(
      view_id view, const std::vector<std::pair<int32_t, std::string>>& keys) const override {
    // Every encoded key in one buffer: one allocation, not one per key.
    std::string encoded;
    std::size_t bytes = 0;
    for (const auto& [p, k] : keys) bytes += 4 + k.size();
    encoded.reserve(bytes);
    for (const auto& [p, k] : keys) append_data_key(encoded, p, k);
    std::vector<rocksdb::Slice> slices;
    slices.reserve(keys.size());
    std::size_t at = 0;
    for (const auto& [p, k] : keys) {
      slices.emplace_back(encoded.data() + at, 4 + k.size());
      at += 4 + k.size();
    }
    std::vector<rocksdb::PinnableSlice> values(keys.size());
    std::vector<rocksdb::Status> statuses(keys.size());
    a_.rdb->MultiGet(options(), a_.views->at(view), slices.size(), slices.data(), values.data(), statuses.data());
    std::vector<std::optional<std::string>> out(keys.size());
    const auto skip = expired(view);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (statuses[i].ok()) {
        if (!skip(values[i])) out[i] = values[i].ToString();
      } else if (!statuses[i].IsNotFound()) {
        return from_rocks(statuses[i], "multi_get");
      }
    }
    return out;
  }

  std::unique_ptr<partition_iterator> scan(view_id view, int32_t partition, std::optional<std::string> lower,
                                           std::optional<std::string> upper, bool descending,
                                           scan_use use) const override {
    return std::make_unique<rocks_partition_iterator>(a_.rdb, a_.views->at(view), snap_, partition, lower, upper,
                                                      descending, use, expired(view));
  }

  std::unique_ptr<partition_cursor> cursor(view_id view, bool descending, scan_use use) const override {
    return std::make_unique<rocks_partition_cursor>(a_.rdb, a_.views->at(view), snap_, descending, use, expired(view));
  }

  result<std::vector<std::pair<std::string, int64_t>>> view_positions(view_id view, int32_t partition) const override {
    return read_view_positions(*a_.rdb, a_.meta, options(), a_.view_names->at(view), partition);
  }

  result<std::optional<int64_t>> history_start(view_id view, int32_t partition) const override {
    auto it = a_.versioned->find(view);
    if (it == a_.versioned->end())
      return status::invalid_argument("'" + a_.view_names->at(view) + "' is not versioned");
    return read_history_start(*a_.rdb, a_.meta, snap_, *it->second, partition);
  }
  result<std::optional<version>> version_at(view_id view, int32_t partition, std::string_view key,
                                            int64_t time) const override {
    return read_version_at(*a_.rdb, versions_cf(view), snap_, partition, key, time);
  }
  result<std::vector<version>> versions(view_id view, int32_t partition, std::string_view key, int64_t from, int64_t to,
                                        int64_t not_before, size_t limit) const override {
    return read_versions(*a_.rdb, versions_cf(view), snap_, partition, key, from, to, not_before, limit);
  }
  std::unique_ptr<partition_cursor> cursor_as_of(view_id view, int64_t time, bool descending,
                                                 scan_use use) const override {
    return make_as_of_cursor(*a_.rdb, versions_cf(view), snap_, time, descending, use);
  }
  std::unique_ptr<partition_iterator> scan_versions(view_id view, int32_t partition) const override {
    return make_version_scan(*a_.rdb, versions_cf(view), snap_, partition);
  }

 private:
  expiry expired(view_id view) const { return expiry{a_.ttl_ms->at(view), a_.now}; }
  // The versions column family of a versioned view; a view without versions reads its
  // own (where no version key ever is: every versioned read then finds nothing).
  rocksdb::ColumnFamilyHandle* versions_cf(view_id view) const {
    auto it = a_.versioned->find(view);
    return it == a_.versioned->end() ? a_.views->at(view) : it->second->cf;
  }
  rocksdb::ReadOptions options() const {
    rocksdb::ReadOptions ro;
    ro.snapshot = snap_;
    return ro;
  }
  snapshot_parts a_;
  const rocksdb::Snapshot* snap_;
  std::optional<view_id> known_view_;
  std::vector<int32_t> known_partitions_;
  std::vector<std::optional<int64_t>> known_;
};

}  // namespace

std::shared_ptr<const snapshot> db::read_snapshot() const {
  // The clock is read only when some view has a ttl.
  const int64_t now = impl_->ttl.empty() ? 0 : impl_->clock();
  return std::make_shared<rocks_snapshot>(snapshot_parts{impl_->rdb.get(), impl_->meta, &impl_->views,
                                                         &impl_->view_names, &impl_->ttl_ms, &impl_->versioned, now});
}

std::shared_ptr<const snapshot> db::read_snapshot(view_id view, const std::vector<int32_t>& partitions) const {
  // As get() does (position_cache.h): tickets taken before the snapshot, checked after
  // it. A write whose data the snapshot holds either ended before its ticket was taken
  // (the ticket has its position) or is seen by the check (writing, or a new version).
  std::vector<position_cache::ticket> tickets;
  tickets.reserve(partitions.size());
  for (int32_t p : partitions) {
    auto t = impl_->positions->enter(view, p);
    if (!t) return read_snapshot();
    tickets.push_back(*t);
  }
  // read_snapshot() makes a rocks_snapshot, not yet shared with anyone.
  auto snap = std::const_pointer_cast<rocks_snapshot>(std::static_pointer_cast<const rocks_snapshot>(read_snapshot()));
  std::vector<std::optional<int64_t>> known;
  known.reserve(tickets.size());
  for (const auto& t : tickets) {
    if (!position_cache::still(t)) return snap;
    known.push_back(t.position == position_cache::absent ? std::nullopt : std::optional<int64_t>(t.position));
  }
  snap->know(view, partitions, std::move(known));
  impl_->cached_position_reads.fetch_add(1, std::memory_order_relaxed);
  return snap;
}

}  // namespace kstate::storage
