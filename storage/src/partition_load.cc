// Installing one partition of a view from a copy made elsewhere (db::load_partition):
// the entries go into SST files as they arrive (one per column family: the view's, its
// versions', its companions'), and the files are ingested with the positions they
// reflect in one atomic step.

#include <rocksdb/options.h>
#include <rocksdb/sst_file_writer.h>

#include <algorithm>
#include <atomic>
#include <filesystem>

#include "db_impl.h"
#include "storage/key_codec.h"

namespace kstate::storage {

result<std::vector<std::pair<std::string, int64_t>>> read_view_positions(rocksdb::DB& rdb,
                                                                         rocksdb::ColumnFamilyHandle* meta,
                                                                         const rocksdb::ReadOptions& ro,
                                                                         std::string_view view, int32_t partition) {
  // "pos" 0x00 name 0x00 partition (4 bytes); the view's names are `view` and "view#...".
  std::string prefix("pos");
  prefix.push_back('\0');
  prefix.append(view);
  std::vector<std::pair<std::string, int64_t>> out;
  std::unique_ptr<rocksdb::Iterator> it(rdb.NewIterator(ro, meta));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    std::string_view k(it->key().data(), it->key().size());
    if (k.size() < prefix.size() + 5 || k[k.size() - 5] != '\0') continue;
    auto name = k.substr(4, k.size() - 4 - 5);
    if (name != view && !(name.size() > view.size() && name[view.size()] == '#')) continue;
    auto part = decode_data_key(k.substr(k.size() - 4));
    if (!part || part->partition != partition) continue;
    auto off = decode_offset(std::string_view(it->value().data(), it->value().size()));
    if (!off)
      return status::corruption("position record of '" + std::string(name) + "' has " +
                                std::to_string(it->value().size()) + " bytes");
    out.emplace_back(std::string(name), *off);
  }
  if (auto s = from_rocks(it->status(), "reading positions"); !s.ok()) return s;
  return out;
}

namespace {

std::atomic<uint64_t> loader_serial{0};

// What a loader needs of the database; the db outlives its loaders.
struct load_parts {
  rocksdb::DB* rdb;
  rocksdb::ColumnFamilyHandle* meta;
  rocksdb::ColumnFamilyHandle* cf;
  std::string view_name;
  const std::map<std::string, window_expiry*, std::less<>>* expiry_by_position;
  const std::map<std::string, versioned_state*, std::less<>>* versioned_by_position;
  rocksdb::ColumnFamilyHandle* versions_cf;  // a versioned view's versions; else null
  // Column families whose partition is replaced with the view's (a join view's sides).
  std::vector<rocksdb::ColumnFamilyHandle*> companions;
  // Where views' positions are published for lookups, and the views by name.
  position_cache* positions;
  const std::map<std::string, view_id, std::less<>>* views_by_name;
};

// The positions of views a load replaces, marked as being written from before the
// partition is cleared until the copy is in (position_cache.h): published when the load
// succeeds, left unknown (read from RocksDB) when it fails on the way.
class position_writes {
 public:
  position_writes(const load_parts& owner, int32_t partition,
                  const std::vector<std::pair<std::string, int64_t>>& replaced,
                  const std::vector<std::pair<std::string, int64_t>>& given) {
    auto add = [&](const std::string& name, int64_t after) {
      auto v = owner.views_by_name->find(name);
      if (v == owner.views_by_name->end()) return;
      for (auto& w : writes_)
        if (w.view == v->second) {
          w.after = after;
          return;
        }
      writes_.push_back({v->second, owner.positions->make(v->second, partition), after});
    };
    for (const auto& [name, offset] : replaced) add(name, position_cache::absent);
    for (const auto& [name, offset] : given) add(name, offset);
    for (auto& w : writes_)
      if (w.slot) position_cache::begin(*w.slot);
  }
  ~position_writes() {
    for (auto& w : writes_)
      if (w.slot) position_cache::end(*w.slot, done_ ? w.after : position_cache::unknown);
  }
  position_writes(const position_writes&) = delete;
  position_writes& operator=(const position_writes&) = delete;
  void done() { done_ = true; }

 private:
  struct write {
    view_id view;
    position_cache::slot* slot;
    int64_t after;
  };
  std::vector<write> writes_;
  bool done_ = false;
};

// [begin, end) of one partition's plain keys in a view's column family. The last
// partition ends where versions begin (prefix with the top bit set).
std::pair<std::string, std::string> partition_range(int32_t partition) {
  return {encode_data_key(partition, {}),
          partition == INT32_MAX ? std::string("\x80\x00\x00\x00", 4) : encode_data_key(partition + 1, {})};
}

class rocks_partition_loader final : public partition_loader {
 public:
  rocks_partition_loader(load_parts parts, view_id view, int32_t partition)
      : owner_(std::move(parts)),
        view_(view),
        partition_(partition),
        cf_(owner_.cf),
        companion_writers_(owner_.companions.size()) {}

  ~rocks_partition_loader() override {
    writer_.reset();
    versions_writer_.reset();
    companion_writers_.clear();
    if (!committed_) {
      std::error_code ec;
      std::filesystem::remove(data_path_, ec);
      std::filesystem::remove(meta_path_, ec);
      std::filesystem::remove(versions_path_, ec);
      for (size_t i = 0; i < owner_.companions.size(); ++i) std::filesystem::remove(companion_path(i), ec);
    }
  }

  status open(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return status::io_error("creating '" + dir + "': " + ec.message());
    auto stem = dir + "/" + std::to_string(view_) + "-" + std::to_string(partition_) + "-" +
                std::to_string(loader_serial.fetch_add(1));
    stem_ = stem;
    data_path_ = stem + ".data.sst";
    meta_path_ = stem + ".positions.sst";
    versions_path_ = stem + ".versions.sst";
    writer_ = std::make_unique<rocksdb::SstFileWriter>(
        rocksdb::EnvOptions(), rocksdb::Options(owner_.rdb->GetDBOptions(), owner_.rdb->GetOptions(cf_)), cf_);
    return from_rocks(writer_->Open(data_path_), "opening '" + data_path_ + "'");
  }

  status add(std::string_view key, std::string_view value) override {
    if (committed_ || !writer_) return status::internal("partition_loader: already committed");
    auto s = writer_->Put(encode_data_key(partition_, key), rocksdb::Slice(value.data(), value.size()));
    if (!s.ok()) return from_rocks(s, "loading entry " + std::to_string(entries_ + 1));
    ++plain_;
    ++entries_;
    bytes_ += key.size() + value.size();
    return status::ok_status();
  }

  status add_companion(size_t i, std::string_view key, std::string_view value) override {
    if (committed_ || !writer_) return status::internal("partition_loader: already committed");
    if (i >= owner_.companions.size())
      return status::invalid_argument("partition_loader: '" + owner_.view_name + "' has no companion " +
                                      std::to_string(i));
    auto& w = companion_writers_[i];
    if (!w) {
      w = std::make_unique<rocksdb::SstFileWriter>(
          rocksdb::EnvOptions(),
          rocksdb::Options(owner_.rdb->GetDBOptions(), owner_.rdb->GetOptions(owner_.companions[i])),
          owner_.companions[i]);
      if (auto s = w->Open(companion_path(i)); !s.ok()) return from_rocks(s, "opening '" + companion_path(i) + "'");
    }
    auto s = w->Put(encode_data_key(partition_, key), rocksdb::Slice(value.data(), value.size()));
    if (!s.ok()) return from_rocks(s, "loading entry " + std::to_string(entries_ + 1));
    ++entries_;
    bytes_ += key.size() + value.size();
    return status::ok_status();
  }

  status add_version(std::string_view key, std::string_view value) override {
    if (committed_ || !writer_) return status::internal("partition_loader: already committed");
    if (!owner_.versions_cf)
      return status::invalid_argument("partition_loader: '" + owner_.view_name + "' keeps no versions");
    if (!versions_writer_) {
      versions_writer_ = std::make_unique<rocksdb::SstFileWriter>(
          rocksdb::EnvOptions(),
          rocksdb::Options(owner_.rdb->GetDBOptions(), owner_.rdb->GetOptions(owner_.versions_cf)), owner_.versions_cf);
      if (auto s = versions_writer_->Open(versions_path_); !s.ok())
        return from_rocks(s, "opening '" + versions_path_ + "'");
    }
    ++versions_;
    auto s = versions_writer_->Put(version_prefix(partition_) + std::string(key),
                                   rocksdb::Slice(value.data(), value.size()));
    if (!s.ok()) return from_rocks(s, "loading entry " + std::to_string(entries_ + 1));
    ++entries_;
    bytes_ += key.size() + value.size();
    return status::ok_status();
  }

  status commit(const std::vector<std::pair<std::string, int64_t>>& positions) override {
    if (committed_ || !writer_) return status::internal("partition_loader: already committed");
    const std::string& view = owner_.view_name;
    bool own = false;
    for (const auto& [name, offset] : positions) {
      if (name == view) own = true;
      else if (name.size() <= view.size() || name.compare(0, view.size(), view) != 0 || name[view.size()] != '#')
        return status::invalid_argument("position '" + name + "' does not belong to view '" + view + "'");
      if (offset < 0) return status::invalid_argument("position '" + name + "' is negative");
    }
    if (!own) return status::invalid_argument("no position for view '" + view + "'");

    std::vector<rocksdb::IngestExternalFileArg> args;
    if (plain_ > 0) {
      if (auto s = writer_->Finish(); !s.ok()) return from_rocks(s, "finishing '" + data_path_ + "'");
      args.emplace_back();
      args.back().column_family = cf_;
      args.back().external_files = {data_path_};
    }
    writer_.reset();
    if (versions_ > 0) {
      if (auto s = versions_writer_->Finish(); !s.ok()) return from_rocks(s, "finishing '" + versions_path_ + "'");
      args.emplace_back();
      args.back().column_family = owner_.versions_cf;
      args.back().external_files = {versions_path_};
    }
    versions_writer_.reset();
    for (size_t i = 0; i < companion_writers_.size(); ++i) {
      if (!companion_writers_[i]) continue;  // nothing of it in the copy
      if (auto s = companion_writers_[i]->Finish(); !s.ok())
        return from_rocks(s, "finishing '" + companion_path(i) + "'");
      companion_writers_[i].reset();
      args.emplace_back();
      args.back().column_family = owner_.companions[i];
      args.back().external_files = {companion_path(i)};
    }

    std::vector<std::pair<std::string, std::string>> keyed;
    for (const auto& [name, offset] : positions)
      keyed.emplace_back(encode_position_key(name, partition_), encode_offset(offset));
    std::sort(keyed.begin(), keyed.end());
    if (std::adjacent_find(keyed.begin(), keyed.end(),
                           [](const auto& a, const auto& b) { return a.first == b.first; }) != keyed.end())
      return status::invalid_argument("a position is given twice");
    rocksdb::SstFileWriter meta_writer(
        rocksdb::EnvOptions(), rocksdb::Options(owner_.rdb->GetDBOptions(), owner_.rdb->GetOptions(owner_.meta)),
        owner_.meta);
    if (auto s = meta_writer.Open(meta_path_); !s.ok()) return from_rocks(s, "opening '" + meta_path_ + "'");
    for (const auto& [k, v] : keyed)
      if (auto s = meta_writer.Put(k, v); !s.ok()) return from_rocks(s, "writing positions");
    if (auto s = meta_writer.Finish(); !s.ok()) return from_rocks(s, "finishing '" + meta_path_ + "'");
    args.emplace_back();
    args.back().column_family = owner_.meta;
    args.back().external_files = {meta_path_};
    for (auto& a : args) a.options.move_files = true;

    // The partition's old data and positions go first, in one write: from here until the
    // ingestion below the partition has no position, so a crash in between makes ingest
    // rebuild it from the beginning; it is never served as caught up half-installed.
    rocksdb::WriteBatch clear;
    const auto [begin, end] = partition_range(partition_);
    if (auto s = clear.DeleteRange(cf_, begin, end); !s.ok()) return from_rocks(s, "clearing the partition");
    for (auto* companion : owner_.companions)  // their partition too, whatever the copy holds of it
      if (auto s = clear.DeleteRange(companion, begin, end); !s.ok()) return from_rocks(s, "clearing the partition");
    if (owner_.versions_cf) {  // a versioned view's versions of the partition too
      auto vbegin = version_prefix(partition_);
      auto vend = partition_ == INT32_MAX ? std::string(5, '\xff') : version_prefix(partition_ + 1);
      if (auto s = clear.DeleteRange(owner_.versions_cf, vbegin, vend); !s.ok())
        return from_rocks(s, "clearing the partition");
    }
    auto old = read_view_positions(*owner_.rdb, owner_.meta, rocksdb::ReadOptions(), view, partition_);
    if (!old.ok()) return old.error();
    for (const auto& [name, offset] : *old)
      if (auto s = clear.Delete(owner_.meta, encode_position_key(name, partition_)); !s.ok())
        return from_rocks(s, "clearing positions");
    position_writes published(owner_, partition_, *old, positions);
    if (auto s = owner_.rdb->Write(rocksdb::WriteOptions(), &clear); !s.ok())
      return from_rocks(s, "clearing the partition");
    // Data and positions of every column family in one atomic ingestion.
    if (auto s = owner_.rdb->IngestExternalFiles(args); !s.ok()) return from_rocks(s, "ingesting the partition");
    published.done();
    committed_ = true;
    for (const auto& [name, offset] : positions)
      if (auto it = owner_.expiry_by_position->find(name); it != owner_.expiry_by_position->end()) {
        std::lock_guard lock(it->second->mu);
        it->second->stream_time[partition_] = offset;
      }
    // A versioned view's stream time is the copy's, or none when the copy has none.
    for (const auto& [name, state] : *owner_.versioned_by_position) {
      if (name.compare(0, view.size() + 1, view + "#") != 0) continue;
      auto given = std::find_if(positions.begin(), positions.end(), [&](const auto& p) { return p.first == name; });
      std::lock_guard lock(state->mu);
      if (given == positions.end()) state->stream_time.erase(partition_);
      else state->stream_time[partition_] = given->second;
    }
    return status::ok_status();
  }

  uint64_t entries() const override { return entries_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  load_parts owner_;
  view_id view_;
  int32_t partition_;
  rocksdb::ColumnFamilyHandle* cf_;
  std::string companion_path(size_t i) const { return stem_ + ".companion-" + std::to_string(i) + ".sst"; }

  std::string stem_, data_path_, meta_path_, versions_path_;
  std::unique_ptr<rocksdb::SstFileWriter> writer_;
  std::unique_ptr<rocksdb::SstFileWriter> versions_writer_;  // opened by the first version
  // Opened by each companion's first entry.
  std::vector<std::unique_ptr<rocksdb::SstFileWriter>> companion_writers_;
  uint64_t plain_ = 0;     // of entries_: the view's own
  uint64_t versions_ = 0;  // of entries_
  uint64_t entries_ = 0;
  uint64_t bytes_ = 0;
  bool committed_ = false;
};

}  // namespace

result<std::unique_ptr<partition_loader>> db::load_partition(view_id view, int32_t partition,
                                                             const std::vector<view_id>& companions) {
  if (view >= impl_->views.size()) return status::invalid_argument("load_partition: unknown view id");
  if (partition < 0) return status::invalid_argument("load_partition: negative partition");
  std::vector<rocksdb::ColumnFamilyHandle*> companion_cfs;
  for (view_id c : companions) {
    if (c >= impl_->views.size() || c == view)
      return status::invalid_argument("load_partition: companion " + std::to_string(c) + " is not another view");
    companion_cfs.push_back(impl_->views[c]);
  }
  auto v = impl_->versioned.find(view);
  rocksdb::ColumnFamilyHandle* versions_cf = v == impl_->versioned.end() ? nullptr : v->second->cf;
  auto loader = std::make_unique<rocks_partition_loader>(
      load_parts{impl_->rdb.get(), impl_->meta, impl_->views[view], impl_->view_names[view], &impl_->expiry_by_position,
                 &impl_->versioned_by_position, versions_cf, std::move(companion_cfs), impl_->positions.get(),
                 &impl_->by_name},
      view, partition);
  if (auto s = loader->open(impl_->rdb->GetName() + "/bootstrap"); !s.ok()) return s;
  return std::unique_ptr<partition_loader>(std::move(loader));
}

}  // namespace kstate::storage
