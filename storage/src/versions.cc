// Versioned table views: the layout of versions (versions.h), their placement on write,
// and the compaction filter that deletes versions that left the history.

#include "versions.h"

#include <algorithm>

#include "core/value_codec.h"
#include "db_impl.h"
#include "storage/key_codec.h"

namespace kstate::storage {

namespace {

void put_u64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t get_u64(std::string_view in) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(in[i]);
  return v;
}

constexpr uint64_t sign_bit = 1ull << 63;

}  // namespace

std::string version_prefix(int32_t partition) {
  return encode_data_key(static_cast<int32_t>(static_cast<uint32_t>(partition) | version_partition_bit), {});
}

std::string version_group(std::string_view key) {
  std::string out;
  out.reserve(key.size() + 4);
  for (char c : key) {
    out.push_back(c);
    if (c == '\0') out.push_back('\xff');
  }
  out.push_back('\0');
  out.push_back('\x01');
  return out;
}

void append_time_desc(std::string& out, int64_t t) { put_u64(out, ~(static_cast<uint64_t>(t) ^ sign_bit)); }

int64_t time_desc(std::string_view eight) { return static_cast<int64_t>(~get_u64(eight) ^ sign_bit); }

std::string version_key(int32_t partition, std::string_view key, int64_t valid_from) {
  std::string out = version_prefix(partition);
  out += version_group(key);
  append_time_desc(out, valid_from);
  return out;
}

std::optional<decoded_version_key> decode_version_key(std::string_view full) {
  // prefix (4) + at least the terminator (2) + time (8)
  if (full.size() < 14 || !(static_cast<unsigned char>(full[0]) & 0x80)) return std::nullopt;
  auto group = full.substr(0, full.size() - 8);
  if (group[group.size() - 2] != '\0' || group[group.size() - 1] != '\x01') return std::nullopt;
  return decoded_version_key{group, time_desc(full.substr(full.size() - 8))};
}

bool unescape_group(std::string_view group, std::string& key) {
  key.clear();
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] != '\0') {
      key.push_back(group[i]);
      continue;
    }
    if (i + 1 >= group.size()) return false;
    if (group[i + 1] == '\x01') return i + 2 == group.size();
    if (group[i + 1] != '\xff') return false;
    key.push_back('\0');
    ++i;
  }
  return false;
}

std::optional<decoded_version_value> decode_version_value(std::string_view v) {
  if (v.size() < version_header + 8 || static_cast<unsigned char>(v[0]) > 1) return std::nullopt;
  return decoded_version_value{v[0] == 1, static_cast<int64_t>(get_u64(v.substr(1, 8))), v.substr(version_header)};
}

std::string encode_version_value(bool tombstone, int64_t valid_to, std::string_view stored) {
  std::string out;
  out.reserve(version_header + stored.size());
  out.push_back(tombstone ? '\x01' : '\x00');
  put_u64(out, static_cast<uint64_t>(valid_to));
  out.append(stored);
  return out;
}

namespace {

// Deletes versions that ended at or before their partition's history start, as of the
// stream times when the compaction started. As for expired windows, a removed entry
// becomes a deletion marker, so no older write of it resurfaces from a lower level.
class version_filter final : public rocksdb::CompactionFilter {
 public:
  version_filter(std::map<int32_t, int64_t> starts, std::atomic<uint64_t>& expired)
      : starts_(std::move(starts)), expired_(expired) {}

  bool Filter(int, const rocksdb::Slice& key, const rocksdb::Slice& value, std::string*, bool*) const override {
    if (key.size() < 4 || !(static_cast<unsigned char>(key[0]) & 0x80)) return false;  // a latest value
    auto part = decode_data_key(std::string_view(key.data(), 4));
    auto it = starts_.find(static_cast<int32_t>(static_cast<uint32_t>(part->partition) & ~version_partition_bit));
    if (it == starts_.end()) return false;
    auto v = decode_version_value(std::string_view(value.data(), value.size()));
    if (!v || v->valid_to > it->second) return false;
    expired_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  const char* Name() const override { return "kstate.versions"; }

 private:
  std::map<int32_t, int64_t> starts_;
  std::atomic<uint64_t>& expired_;
};

class version_filter_factory final : public rocksdb::CompactionFilterFactory {
 public:
  explicit version_filter_factory(std::shared_ptr<versioned_state> state) : state_(std::move(state)) {}
  std::unique_ptr<rocksdb::CompactionFilter> CreateCompactionFilter(
      const rocksdb::CompactionFilter::Context&) override {
    std::map<int32_t, int64_t> starts;
    {
      std::lock_guard lock(state_->mu);
      for (const auto& [p, t] : state_->stream_time) starts.emplace(p, history_start_at(t, state_->history_ms));
    }
    return std::make_unique<version_filter>(std::move(starts), state_->expired);
  }
  const char* Name() const override { return "kstate.versions"; }

 private:
  std::shared_ptr<versioned_state> state_;
};

// A version as placement sees it: stored in the database or written earlier in the batch.
struct neighbour {
  std::string key;
  std::string value;
};

// The writes of one db::write() placed so far, by version key: they take precedence over
// what the database holds.
using overlay = std::map<std::string, std::string, std::less<>>;

// The stored neighbours of the version `target` would be: the one with the largest
// valid_from <= its time (`older`, at or after `target` in stored order) and the one
// with the smallest valid_from > it (`newer`, just before `target`), from the database
// and the overlay. A key's versions are stored newest first, so one seek to the group's
// start and a few steps find both when the record is newer than all but a few versions
// (the common case: in order, or slightly late); past `max_steps`, a seek to `target`
// and one back.
struct neighbours {
  std::optional<neighbour> older, newer;
};
constexpr int max_steps = 8;

neighbours find_neighbours(rocksdb::Iterator& it, const overlay& ov, const std::string& target,
                           std::string_view group_begin) {
  neighbours n;
  const rocksdb::Slice group(group_begin.data(), group_begin.size());
  const rocksdb::Slice at(target);
  auto in_group = [&] { return it.Valid() && it.key().starts_with(group); };
  it.Seek(group);
  int steps = 0;
  for (; in_group() && it.key().compare(at) < 0 && steps < max_steps; ++steps) it.Next();
  if (in_group() && it.key().compare(at) < 0) {
    // Many newer versions: straight to `target`, then one back.
    it.Seek(at);
    if (in_group()) n.older = neighbour{it.key().ToString(), it.value().ToString()};
    it.SeekForPrev(at);
    if (it.Valid() && it.key() == at) it.Prev();
    if (in_group()) n.newer = neighbour{it.key().ToString(), it.value().ToString()};
  } else {
    if (in_group()) n.older = neighbour{it.key().ToString(), it.value().ToString()};
    if (steps > 0) {
      if (it.Valid()) it.Prev();
      else it.SeekForPrev(at);
      if (in_group() && it.key().compare(at) < 0) n.newer = neighbour{it.key().ToString(), it.value().ToString()};
    }
  }
  // The overlay's writes take precedence over the database's for the same key.
  if (auto o = ov.lower_bound(target); o != ov.end() && std::string_view(o->first).starts_with(group_begin))
    if (!n.older || o->first <= n.older->key) n.older = neighbour{o->first, o->second};
  if (auto o = ov.lower_bound(target); o != ov.begin()) {
    --o;
    if (std::string_view(o->first).starts_with(group_begin) && (!n.newer || o->first >= n.newer->key))
      n.newer = neighbour{o->first, o->second};
  }
  return n;
}

}  // namespace

std::shared_ptr<rocksdb::CompactionFilterFactory> make_version_filter_factory(std::shared_ptr<versioned_state> state) {
  return std::make_shared<version_filter_factory>(std::move(state));
}

status place_versions(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* meta,
                      const std::vector<rocksdb::ColumnFamilyHandle*>& views,
                      const std::vector<std::string>& view_names,
                      const std::map<view_id, std::shared_ptr<versioned_state>>& versioned,
                      const std::vector<pending_version>& pending, std::string_view arena, rocksdb::WriteBatch& out,
                      std::vector<published_stream_time>& publish) {
  // Stream time per (view, partition): as stored, then advanced by this batch.
  std::map<std::pair<view_id, int32_t>, std::optional<int64_t>> stream;
  std::map<view_id, std::pair<std::unique_ptr<rocksdb::Iterator>, overlay>> readers;
  // Records too late to place, per view: how many, and the first of them.
  std::map<view_id, std::pair<uint64_t, const pending_version*>> late;
  for (const auto& pv : pending) {
    auto vs = versioned.find(pv.view);
    if (pv.view >= views.size() || vs == versioned.end())
      return status::internal("put_version: view " + std::to_string(pv.view) + " is not versioned");
    const versioned_state& state = *vs->second;
    auto [st, fresh] = stream.try_emplace({pv.view, pv.partition});
    if (fresh) {
      std::string v;
      auto s = rdb.Get(rocksdb::ReadOptions(), meta, encode_position_key(state.stream_time_position, pv.partition), &v);
      if (!s.ok() && !s.IsNotFound()) return from_rocks(s, "reading the stream time of '" + view_names[pv.view] + "'");
      if (s.ok()) st->second = decode_offset(v);
    }
    // Too late to place: the version it would cut short may be deleted already, so its
    // answer would be a guess. Kafka Streams' versioned stores drop these too.
    if (st->second && pv.timestamp < history_start_at(*st->second, state.history_ms)) {
      auto& [count, first] = late[pv.view];
      if (count++ == 0) first = &pv;
      storage_log()->debug("store '{}' partition {} offset {}: timestamp {} is older than the history kept; dropped",
                           view_names[pv.view], pv.partition, pv.offset, pv.timestamp);
      continue;
    }
    st->second = std::max(st->second.value_or(INT64_MIN), pv.timestamp);

    auto& [it, ov] = readers[pv.view];
    if (!it) it.reset(rdb.NewIterator(rocksdb::ReadOptions(), state.cf));
    const std::string_view key(arena.data() + pv.key_at, pv.key_size);
    const std::string target = version_key(pv.partition, key, pv.timestamp);
    const std::string_view group_begin(target.data(), target.size() - 8);
    auto [older, newer] = find_neighbours(*it, ov, target, group_begin);
    if (auto s = from_rocks(it->status(), "reading versions"); !s.ok()) return s;

    int64_t valid_to = still_valid;
    if (older && older->key == target) {
      // The same timestamp: this record replaces that version, which ends where it did.
      if (auto d = decode_version_value(older->value)) valid_to = d->valid_to;
    } else {
      if (newer)
        if (auto d = decode_version_key(newer->key)) valid_to = d->valid_from;
      if (older)
        if (auto d = decode_version_value(older->value)) {
          // The older version now ends where this one begins.
          auto cut = encode_version_value(d->tombstone, pv.timestamp, d->stored);
          if (auto s = out.Put(state.cf, older->key, cut); !s.ok()) return from_rocks(s, "placing a version");
          ov[older->key] = std::move(cut);
        }
    }
    const auto frame = frame_header(pv.offset);
    std::string stored(frame.data(), frame.size());
    if (!pv.tombstone) stored.append(arena.data() + pv.value_at, pv.value_size);
    auto value = encode_version_value(pv.tombstone, valid_to, stored);
    if (auto s = out.Put(state.cf, target, value); !s.ok()) return from_rocks(s, "placing a version");
    ov[target] = std::move(value);
    if (valid_to == still_valid) {
      // The newest version: the latest value, where plain reads find it.
      const std::string data_key = encode_data_key(pv.partition, key);
      auto s = pv.tombstone ? out.Delete(views[pv.view], data_key) : out.Put(views[pv.view], data_key, stored);
      if (!s.ok()) return from_rocks(s, "writing the latest value");
    }
  }
  for (const auto& [vp, t] : stream) {
    if (!t) continue;
    auto& state = *versioned.at(vp.first);
    if (auto s = out.Put(meta, encode_position_key(state.stream_time_position, vp.second), encode_offset(*t)); !s.ok())
      return from_rocks(s, "writing the stream time");
    publish.push_back({&state, vp.second, *t});
  }
  for (const auto& [view, counted] : late) {
    const auto& [count, first] = counted;
    versioned.at(view)->late.fetch_add(count, std::memory_order_relaxed);
    storage_log()->warn(
        "store '{}': {} record(s) too late to place (older than stream time minus history), dropped; first: partition "
        "{} offset {} timestamp {}",
        view_names[view], count, first->partition, first->offset, first->timestamp);
  }
  return status::ok_status();
}

}  // namespace kstate::storage
