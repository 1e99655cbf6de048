#include "storage/db.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/version.h>
#include <rocksdb/write_batch.h>
#include <rocksdb/write_buffer_manager.h>
#include <spdlog/spdlog.h>

#include "core/log.h"
#include "core/value_codec.h"
#include "db_impl.h"
#include "storage/key_codec.h"

namespace kstate::storage {

status from_rocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return status::ok_status();
  std::string msg = std::string(what) + ": " + s.ToString();
  if (s.IsCorruption()) return status::corruption(msg);
  if (s.IsInvalidArgument()) return status::invalid_argument(msg);
  if (s.IsNotFound()) return status::not_found(msg);
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) return status::unavailable(msg);
  if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) return status::unavailable(msg);
  return status::io_error(msg);
}

std::shared_ptr<spdlog::logger> storage_log() {
  static const auto l = module_logger("storage");
  return l;
}

namespace {

constexpr const char* meta_cf_name = "__kstate_meta";
// The instance identity's keys in the meta column family (db::instance_id).
constexpr const char* id_key = "instance-id";
constexpr const char* where_key = "instance-where";

result<rocksdb::CompressionType> parse_compression(const std::string& name) {
  if (name == "none") return rocksdb::kNoCompression;
  if (name == "snappy") return rocksdb::kSnappyCompression;
  if (name == "lz4") return rocksdb::kLZ4Compression;
  if (name == "zstd") return rocksdb::kZSTD;
  return status::invalid_argument("compression must be one of none, snappy, lz4, zstd (got '" + name + "')");
}

result<rocksdb::CompactionStyle> parse_compaction_style(const std::string& name) {
  if (name == "level") return rocksdb::kCompactionStyleLevel;
  if (name == "universal") return rocksdb::kCompactionStyleUniversal;
  return status::invalid_argument("compaction_style must be one of level, universal (got '" + name + "')");
}

// RocksDB's info log, routed into the storage logger (warnings and above by default;
// RocksDB's own INFO chatter goes to debug).
class spdlog_rocksdb_logger final : public rocksdb::Logger {
 public:
  spdlog_rocksdb_logger() : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    char buf[1024];
    vsnprintf(buf, sizeof buf, format, ap);
    auto lvl = level >= rocksdb::InfoLogLevel::ERROR_LEVEL  ? spdlog::level::err
               : level == rocksdb::InfoLogLevel::WARN_LEVEL ? spdlog::level::warn
                                                            : spdlog::level::debug;
    // Files made by SstFileWriter (partition copies, db::load_partition) carry no unique
    // id, and RocksDB warns once for every such file it opens: expected, not a fault.
    if (lvl == spdlog::level::warn && std::strstr(buf, "opened without unique ID to verify"))
      lvl = spdlog::level::debug;
    storage_log()->log(lvl, "rocksdb: {}", buf);
  }
  void Logv(const char* format, va_list ap) override { Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap); }
};

// Column family options from store options; everything is charged to the shared cache.
result<rocksdb::ColumnFamilyOptions> cf_options(const store_options& o, const std::shared_ptr<rocksdb::Cache>& cache) {
  auto compression = parse_compression(o.compression);
  if (!compression) return compression.error();
  auto style = parse_compaction_style(o.compaction_style);
  if (!style) return style.error();
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  // Index and filter blocks live in the cache too, so they count against the budget.
  table.cache_index_and_filter_blocks = true;
  table.cache_index_and_filter_blocks_with_high_priority = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  if (o.bloom_bits_per_key > 0) table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(o.bloom_bits_per_key, false));
  // Partitioned index and filters: a small top-level index per file stays pinned, and a
  // lookup loads only the 4 KiB index and filter partitions it needs. With one index
  // and one filter block per file, a large file's filter (1.2 MiB for a million keys)
  // is a single cache entry bigger than a cache shard: evicted as soon as it is
  // released, re-read by the next lookup, which then costs a hundred microseconds.
  table.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
  table.partition_filters = o.bloom_bits_per_key > 0;
  table.metadata_block_size = 4096;
  table.pin_top_level_index_and_filter = true;
  table.format_version = 5;
  rocksdb::ColumnFamilyOptions cf;
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  cf.write_buffer_size = o.write_buffer_bytes;
  if (o.bloom_bits_per_key > 0) {
    // A bloom filter over the memtable's keys: a lookup of a key the memtable does not
    // hold (most keys, once most of the table is in files) skips the skip list search,
    // a pointer chase through about log2(entries) nodes. Sized as 2% of the write
    // buffer, in it: over 10 bits per entry for entries of up to 100 bytes.
    cf.memtable_whole_key_filtering = true;
    cf.memtable_prefix_bloom_size_ratio = 0.02;
  }
  cf.max_write_buffer_number = o.max_write_buffers;
  cf.compression = *compression;
  cf.compaction_style = *style;
  if (*style == rocksdb::kCompactionStyleLevel) cf.level_compaction_dynamic_level_bytes = true;
  return cf;
}

}  // namespace

db::impl::~impl() {
  stop_verify();
  stop_expiry();
  for (auto* h : handles) {
    if (h == rdb->DefaultColumnFamily()) continue;
    auto s = rdb->DestroyColumnFamilyHandle(h);
    if (!s.ok()) storage_log()->warn("destroying column family handle: {}", s.ToString());
  }
  if (rdb) {
    auto s = rdb->Close();
    if (!s.ok()) storage_log()->warn("close: {}", s.ToString());
  }
}

struct write_batch::impl {
  const db::impl* owner;
  rocksdb::WriteBatch batch;
  // Stream times of windowed views written by this batch, published by db::write.
  struct stream_time {
    window_expiry* view;
    int32_t partition;
    int64_t time;
  };
  std::vector<stream_time> stream_times;
  // Positions of views this batch writes, in order, published by db::write.
  struct view_position {
    view_id view;
    int32_t partition;
    int64_t next_offset;
  };
  std::vector<view_position> positions;
  // Versions of versioned views, placed by db::write (their keys and values in arena).
  std::vector<pending_version> versions;
  std::string arena;
  // The first operation that could not be added; db::write refuses the batch with it.
  status failed;

  void note(const rocksdb::Status& s, const char* what) {
    if (!s.ok() && failed.ok()) failed = from_rocks(s, what);
  }
  // The column family of `view`, or null (and the batch failed) for an unknown id.
  rocksdb::ColumnFamilyHandle* family(view_id view, const char* what) {
    if (view < owner->views.size()) return owner->views[view];
    if (failed.ok()) failed = status::internal(std::string(what) + ": unknown view id " + std::to_string(view));
    return nullptr;
  }
};

write_batch::write_batch(std::unique_ptr<impl> i) : impl_(std::move(i)) {}
write_batch::~write_batch() = default;
write_batch::write_batch(write_batch&&) noexcept = default;
write_batch& write_batch::operator=(write_batch&&) noexcept = default;

namespace {

// The 4-byte big-endian partition prefix of a data key (see key_codec.h), built on the
// stack so a put needs no allocation: RocksDB gathers the key from its parts.
struct partition_prefix {
  char bytes[4];
  explicit partition_prefix(int32_t partition) {
    auto v = static_cast<uint32_t>(partition);
    bytes[0] = static_cast<char>(v >> 24);
    bytes[1] = static_cast<char>(v >> 16);
    bytes[2] = static_cast<char>(v >> 8);
    bytes[3] = static_cast<char>(v);
  }
};

}  // namespace

void write_batch::put(view_id view, int32_t partition, std::string_view key, std::string_view value) {
  put(view, partition, key, {}, value);
}

void write_batch::put(view_id view, int32_t partition, std::string_view key, std::string_view value_head,
                      std::string_view value_tail) {
  partition_prefix prefix(partition);
  rocksdb::Slice key_parts[2] = {rocksdb::Slice(prefix.bytes, 4), rocksdb::Slice(key.data(), key.size())};
  rocksdb::Slice value_parts[2] = {rocksdb::Slice(value_head.data(), value_head.size()),
                                   rocksdb::Slice(value_tail.data(), value_tail.size())};
  auto* cf = impl_->family(view, "write_batch::put");
  if (!cf) return;
  impl_->note(impl_->batch.Put(cf, rocksdb::SliceParts(key_parts, 2), rocksdb::SliceParts(value_parts, 2)),
              "write_batch::put");
}

void write_batch::del(view_id view, int32_t partition, std::string_view key) {
  partition_prefix prefix(partition);
  rocksdb::Slice key_parts[2] = {rocksdb::Slice(prefix.bytes, 4), rocksdb::Slice(key.data(), key.size())};
  auto* cf = impl_->family(view, "write_batch::del");
  if (!cf) return;
  impl_->note(impl_->batch.Delete(cf, rocksdb::SliceParts(key_parts, 2)), "write_batch::del");
}

void write_batch::put_version(view_id view, int32_t partition, std::string_view key, int64_t timestamp, int64_t offset,
                              std::optional<std::string_view> value) {
  if (!impl_->family(view, "write_batch::put_version")) return;
  if (!impl_->owner->versioned.count(view)) {
    if (impl_->failed.ok())
      impl_->failed = status::internal("write_batch::put_version: '" + impl_->owner->view_names[view] +
                                       "' is not a versioned view");
    return;
  }
  pending_version pv{view, partition, timestamp, offset, !value, 0, 0, 0, 0};
  pv.key_at = static_cast<uint32_t>(impl_->arena.size());
  pv.key_size = static_cast<uint32_t>(key.size());
  impl_->arena.append(key);
  pv.value_at = static_cast<uint32_t>(impl_->arena.size());
  if (value) {
    pv.value_size = static_cast<uint32_t>(value->size());
    impl_->arena.append(*value);
  }
  impl_->versions.push_back(pv);
}

void write_batch::set_position(view_id view, int32_t partition, int64_t next_offset) {
  if (!impl_->family(view, "write_batch::set_position")) return;
  auto k = encode_position_key(impl_->owner->view_names[view], partition);
  impl_->note(impl_->batch.Put(impl_->owner->meta, k, encode_offset(next_offset)), "write_batch::set_position");
  impl_->positions.push_back({view, partition, next_offset});
}

void write_batch::set_named_position(std::string_view name, int32_t partition, int64_t next_offset) {
  auto k = encode_position_key(name, partition);
  impl_->note(impl_->batch.Put(impl_->owner->meta, k, encode_offset(next_offset)), "write_batch::set_named_position");
  // A named position may be a view's own (a companion column family opened as a view).
  if (auto it = impl_->owner->by_name.find(name); it != impl_->owner->by_name.end())
    impl_->positions.push_back({it->second, partition, next_offset});
  if (auto it = impl_->owner->expiry_by_position.find(name); it != impl_->owner->expiry_by_position.end())
    impl_->stream_times.push_back({it->second, partition, next_offset});
}

size_t write_batch::operation_count() const {
  return static_cast<size_t>(impl_->batch.Count()) + impl_->versions.size();
}
size_t write_batch::byte_size() const { return impl_->batch.GetDataSize() + impl_->arena.size(); }
void write_batch::clear() {
  impl_->batch.Clear();
  impl_->stream_times.clear();
  impl_->positions.clear();
  impl_->versions.clear();
  impl_->arena.clear();
  impl_->failed = status::ok_status();
}
const status& write_batch::error() const { return impl_->failed; }

std::vector<write_batch::entry> write_batch::entries() const {
  struct decoder : rocksdb::WriteBatch::Handler {
    const db::impl* owner;
    std::vector<entry> out;
    rocksdb::Status bad = rocksdb::Status::OK();

    void add(uint32_t cf, const rocksdb::Slice& key, std::optional<std::string> value) {
      if (cf == owner->meta->GetID()) {
        // "pos\0<view>\0<partition>" -> offset
        // The partition is the last 4 bytes (it may contain zero bytes itself).
        std::string_view k(key.data(), key.size());
        auto first = k.find('\0');
        if (first == std::string_view::npos || k.size() < first + 6) return;
        auto name = k.substr(first + 1, k.size() - 5 - (first + 1));
        auto it = owner->by_name.find(name);
        auto part = decode_data_key(k.substr(k.size() - 4));
        if (!part) return;
        entry e{it == owner->by_name.end() ? view_id(-1) : it->second, part->partition, {}, {}, {}};
        if (value) e.position = decode_offset(*value);
        out.push_back(std::move(e));
        return;
      }
      auto dk = decode_data_key(std::string_view(key.data(), key.size()));
      auto it = owner->by_cf_id.find(cf);
      if (!dk || it == owner->by_cf_id.end()) return;
      out.push_back(entry{it->second, dk->partition, std::string(dk->key), std::move(value), {}});
    }
    rocksdb::Status PutCF(uint32_t cf, const rocksdb::Slice& k, const rocksdb::Slice& v) override {
      add(cf, k, v.ToString());
      return rocksdb::Status::OK();
    }
    rocksdb::Status DeleteCF(uint32_t cf, const rocksdb::Slice& k) override {
      add(cf, k, std::nullopt);
      return rocksdb::Status::OK();
    }
  } d;
  d.owner = impl_->owner;
  auto s = impl_->batch.Iterate(&d);
  if (!s.ok()) throw std::runtime_error("write_batch::entries: " + s.ToString());
  // Versions not placed yet: each as the record it is (its stored value, or a delete).
  for (const auto& pv : impl_->versions) {
    std::optional<std::string> value;
    if (!pv.tombstone) {
      const auto frame = frame_header(pv.offset);
      value.emplace(frame.data(), frame.size());
      value->append(impl_->arena, pv.value_at, pv.value_size);
    }
    d.out.push_back(entry{pv.view, pv.partition, impl_->arena.substr(pv.key_at, pv.key_size), std::move(value), {}});
  }
  return std::move(d.out);
}

namespace {

// RocksDB refused to open the database for what is (or is not) in it: a file it lists is
// missing, or a file is corrupt. Not a directory it cannot write, nor a lock.
bool is_damage(const rocksdb::Status& s) {
  if (s.IsCorruption()) return true;
  return (s.IsIOError() || s.IsNotFound()) && s.ToString().find("No such file or directory") != std::string::npos;
}

// The state directory does not take writes (opening writes the LOCK, a MANIFEST, a log).
bool refuses_writes(const rocksdb::Status& s) {
  const auto m = s.ToString();
  return m.find("Read-only file system") != std::string::npos || m.find("No space left") != std::string::npos ||
         m.find("Permission denied") != std::string::npos;
}

// Files of a database in `dir` without the CURRENT file naming its MANIFEST. RocksDB
// would take the directory for a new database and replay the write-ahead logs it finds
// over nothing: positions without the state they describe.
bool headless(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(dir) / "CURRENT", ec) || ec) return false;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto n = e.path().filename().string();
    if (n.rfind("MANIFEST-", 0) == 0 || e.path().extension() == ".sst" || e.path().extension() == ".log") return true;
  }
  return false;
}

// Moves every entry of `dir` except earlier quarantines into quarantine/<UTC time>/
// under it; returns that directory. A rename within one directory tree: no copy.
result<std::string> quarantine(const std::string& dir) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  const std::filesystem::path base = std::filesystem::path(dir) / "quarantine" / stamp;
  auto to = base;
  std::error_code ec;
  for (int n = 2; std::filesystem::exists(to, ec); ++n) to = base.string() + "-" + std::to_string(n);
  std::filesystem::create_directories(to, ec);
  if (ec) return status::io_error("cannot create '" + to.string() + "': " + ec.message());
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().filename() == "quarantine") continue;
    std::filesystem::rename(e.path(), to / e.path().filename(), ec);
    if (ec)
      return status::io_error("cannot move '" + e.path().string() + "' to '" + to.string() + "': " + ec.message());
  }
  if (ec) return status::io_error("cannot list '" + dir + "': " + ec.message());
  return to.string();
}

// The instance identity (db::instance_id) kept in a database RocksDB would not open,
// read as far as it can be: opened read-only, without the consistency checks that
// refused it. Empty when it cannot be read.
std::vector<std::pair<std::string, std::string>> salvage_identity(const std::string& dir,
                                                                  const std::shared_ptr<rocksdb::Logger>& log) {
  std::vector<std::pair<std::string, std::string>> out;
  rocksdb::DBOptions o;
  o.paranoid_checks = false;
  o.info_log = log;
  std::vector<rocksdb::ColumnFamilyDescriptor> descs{{rocksdb::kDefaultColumnFamilyName, {}}, {meta_cf_name, {}}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  if (!rocksdb::DB::OpenForReadOnly(o, dir, descs, &handles, &raw).ok()) return out;
  std::unique_ptr<rocksdb::DB> old(raw);
  for (const char* key : {id_key, where_key}) {
    std::string v;
    if (old->Get(rocksdb::ReadOptions(), handles[1], key, &v).ok()) out.emplace_back(key, std::move(v));
  }
  for (auto* h : handles) (void)old->DestroyColumnFamilyHandle(h);  // closing: nothing to do on failure
  return out;
}

}  // namespace

db::db(std::unique_ptr<impl> i) : impl_(std::move(i)) {}
db::~db() = default;

result<std::unique_ptr<db>> db::open(const db_options& opts, const std::vector<std::string>& views) {
  std::error_code ec;
  std::filesystem::create_directories(opts.path, ec);
  if (ec) return status::io_error("cannot create state directory '" + opts.path + "': " + ec.message());
  ::chmod(opts.path.c_str(), 0700);

  auto i = std::make_unique<impl>();
  // The cache holds high-priority blocks (index, filter) in a reserved pool so data
  // scans don't evict them.
  rocksdb::LRUCacheOptions cache_opts;
  cache_opts.capacity = opts.block_cache_bytes;
  cache_opts.high_pri_pool_ratio = 0.1;
  i->cache = rocksdb::NewLRUCache(cache_opts);
  i->statistics = rocksdb::CreateDBStatistics();
  // Tickers only (cache hits, bytes, stall time: what the metrics read). Histograms and
  // timers would read the clock around every Get and Write.
  i->statistics->set_stats_level(rocksdb::StatsLevel::kExceptHistogramOrTimers);

  auto defaults = cf_options(opts.defaults, i->cache);
  if (!defaults) return defaults.error();
  for (const auto& [name, o] : opts.per_store)
    if (auto check = cf_options(o, i->cache); !check)
      return status::invalid_argument("store '" + name + "': " + check.error().message());

  rocksdb::DBOptions db_opts;
  db_opts.create_if_missing = true;
  db_opts.create_missing_column_families = true;
  db_opts.max_background_jobs = opts.max_background_jobs;
  db_opts.bytes_per_sync = 1 << 20;
  db_opts.keep_log_file_num = 5;
  db_opts.statistics = i->statistics;
  db_opts.info_log = std::make_shared<spdlog_rocksdb_logger>();
  // Memtables of every view are charged to the block cache: one budget for all memory.
  uint64_t wbm = opts.write_buffer_manager_bytes ? opts.write_buffer_manager_bytes : opts.block_cache_bytes / 4;
  db_opts.write_buffer_manager = std::make_shared<rocksdb::WriteBufferManager>(wbm, i->cache);
  db_opts.max_total_wal_size = 4 * wbm;

  // Open every column family that exists, plus the configured views and meta.
  std::vector<std::string> names;
  {
    std::vector<std::string> existing;
    auto s = rocksdb::DB::ListColumnFamilies(db_opts, opts.path, &existing);
    if (s.ok()) names = existing;  // a missing database is not an error here
  }
  auto ensure = [&](const std::string& n) {
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  };
  ensure(rocksdb::kDefaultColumnFamilyName);
  ensure(meta_cf_name);
  for (const auto& v : views) {
    if (v.empty() || v.rfind("__kstate", 0) == 0) return status::invalid_argument("invalid view name '" + v + "'");
    ensure(v);
  }
  for (const auto& [name, vs] : opts.versioned) ensure(name + versions_cf_suffix);

  std::map<std::string, std::shared_ptr<window_expiry>> expiry;
  for (const auto& [name, w] : opts.windowed) {
    if (std::find(views.begin(), views.end(), name) == views.end())
      return status::invalid_argument("windowed store '" + name + "' is not a configured view");
    auto state = std::make_shared<window_expiry>();
    state->spec = w.spec;
    expiry.emplace(name, std::move(state));
  }

  i->clock = opts.clock ? opts.clock : [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  std::map<std::string, std::shared_ptr<ttl_state>> ttl;
  for (const auto& [name, ms] : opts.ttl_ms) {
    if (std::find(views.begin(), views.end(), name) == views.end())
      return status::invalid_argument("store '" + name + "' with a ttl is not a configured view");
    if (ms <= 0) return status::invalid_argument("ttl of store '" + name + "' must be positive");
    if (expiry.count(name)) return status::invalid_argument("windowed store '" + name + "' cannot have a ttl");
    auto state = std::make_shared<ttl_state>();
    state->ttl_ms = ms;
    state->clock = i->clock;
    ttl.emplace(name, std::move(state));
  }

  std::map<std::string, std::shared_ptr<versioned_state>> versioned;
  for (const auto& [name, vs] : opts.versioned) {
    if (std::find(views.begin(), views.end(), name) == views.end())
      return status::invalid_argument("versioned store '" + name + "' is not a configured view");
    if (vs.history_ms <= 0) return status::invalid_argument("history of store '" + name + "' must be positive");
    if (expiry.count(name) || ttl.count(name))
      return status::invalid_argument("versioned store '" + name + "' cannot be windowed or have a ttl");
    auto state = std::make_shared<versioned_state>();
    state->history_ms = vs.history_ms;
    state->stream_time_position = vs.stream_time_position;
    versioned.emplace(name, std::move(state));
  }

  std::vector<rocksdb::ColumnFamilyDescriptor> descs;
  for (const auto& n : names) {
    auto it = opts.per_store.find(n);
    auto cf = it == opts.per_store.end() ? *defaults : *cf_options(it->second, i->cache);
    if (auto e = expiry.find(n); e != expiry.end())
      cf.compaction_filter_factory = make_window_expiry_filter_factory(e->second);
    if (auto t = ttl.find(n); t != ttl.end()) {
      cf.compaction_filter_factory = make_ttl_filter_factory(t->second);
      // Files older than this are compacted (their filter run) whatever else happens: a
      // view nobody writes to any more still frees its expired keys. At least an hour,
      // so a short ttl does not rewrite the files all the time.
      cf.periodic_compaction_seconds = static_cast<uint64_t>(std::max<int64_t>(t->second->ttl_ms / 1000, 3600));
    }
    if (auto v = n.size() > std::strlen(versions_cf_suffix) && n.compare(n.size() - std::strlen(versions_cf_suffix),
                                                                         std::string::npos, versions_cf_suffix) == 0
                     ? versioned.find(n.substr(0, n.size() - std::strlen(versions_cf_suffix)))
                     : versioned.end();
        v != versioned.end()) {
      cf.compaction_filter_factory = make_version_filter_factory(v->second);
      // As for a ttl: files nobody rewrites still shed old versions, at most hourly.
      cf.periodic_compaction_seconds = static_cast<uint64_t>(std::max<int64_t>(v->second->history_ms / 1000, 3600));
    }
    descs.emplace_back(n, std::move(cf));
  }
  rocksdb::DB* raw = nullptr;
  auto s = headless(opts.path)
               ? rocksdb::Status::Corruption("CURRENT is missing, yet files of a database are in " + opts.path)
               : rocksdb::DB::Open(db_opts, opts.path, descs, &i->handles, &raw);
  std::vector<std::pair<std::string, std::string>> identity;
  if (!s.ok() && is_damage(s)) {
    // Moved aside, not deleted: an operator may want to look at it, or recover from it.
    auto moved = quarantine(opts.path);
    if (!moved.ok())
      return status::corruption("the database at '" + opts.path + "' is damaged (" + s.ToString() +
                                ") and could not be moved aside: " + moved.error().message());
    storage_log()->error(
        "the database at '{}' is damaged and cannot be opened ({}): moved to '{}', starting from an empty one; "
        "every view is rebuilt from Kafka (or copied from another instance)",
        opts.path, s.ToString(), *moved);
    i->quarantined = quarantine_info{*moved, s.ToString()};
    identity = salvage_identity(*moved, db_opts.info_log);
    i->handles.clear();
    // Column families of views no longer configured went with it.
    descs.erase(std::remove_if(descs.begin(), descs.end(),
                               [&](const rocksdb::ColumnFamilyDescriptor& d) {
                                 return d.name != rocksdb::kDefaultColumnFamilyName && d.name != meta_cf_name &&
                                        std::find(views.begin(), views.end(), d.name) == views.end() &&
                                        std::none_of(opts.versioned.begin(), opts.versioned.end(), [&](const auto& v) {
                                          return d.name == v.first + versions_cf_suffix;
                                        });
                               }),
                descs.end());
    s = rocksdb::DB::Open(db_opts, opts.path, descs, &i->handles, &raw);
  }
  if (!s.ok()) {
    if (refuses_writes(s))
      return status::io_error("the state directory '" + opts.path + "' refuses writes (" + s.ToString() +
                              "): kstate keeps its state there; make it writable (or free space) and start again");
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos)
      return status::unavailable("state directory '" + opts.path +
                                 "' is in use by another process (RocksDB LOCK held): " + s.ToString());
    return from_rocks(s, "opening RocksDB at '" + opts.path + "'");
  }
  i->rdb.reset(raw);
  i->path = opts.path;
  // Files of partition loads that never committed (a crash during a bootstrap).
  std::filesystem::remove_all(opts.path + "/bootstrap", ec);

  std::map<std::string, rocksdb::ColumnFamilyHandle*> by_name;
  for (auto* h : i->handles) by_name[h->GetName()] = h;
  i->meta = by_name.at(meta_cf_name);
  if (!identity.empty()) {  // the damaged database's identity, kept by its directory
    rocksdb::WriteBatch b;
    for (const auto& [k, v] : identity)
      if (auto p = b.Put(i->meta, k, v); !p.ok()) return from_rocks(p, "keeping the instance id");
    rocksdb::WriteOptions wo;
    wo.sync = true;
    if (auto w = i->rdb->Write(wo, &b); !w.ok()) return from_rocks(w, "keeping the instance id");
  }
  for (const auto& v : views) {
    auto id = static_cast<view_id>(i->views.size());
    auto* h = by_name.at(v);
    i->views.push_back(h);
    i->view_names.push_back(v);
    i->by_cf_id[h->GetID()] = id;
    i->by_name.emplace(v, id);
  }

  i->ttl_ms.assign(i->views.size(), 0);
  for (auto& [name, state] : ttl) {
    const view_id id = i->by_name.at(name);
    i->ttl_ms[id] = state->ttl_ms;
    i->ttl.emplace(id, std::move(state));
  }
  for (auto& [name, state] : expiry) {
    const auto& position = opts.windowed.at(name).stream_time_position;
    if (auto st = load_stream_times(*i->rdb, i->meta, name, position, state->stream_time); !st.ok()) return st;
    i->expiry_by_position.emplace(position, state.get());
    i->expiry.emplace(i->by_name.at(name), std::move(state));
  }
  for (auto& [name, state] : versioned) {
    if (auto st = load_stream_times(*i->rdb, i->meta, name, state->stream_time_position, state->stream_time); !st.ok())
      return st;
    state->cf = by_name.at(name + versions_cf_suffix);
    i->versioned_by_position.emplace(state->stream_time_position, state.get());
    i->versioned.emplace(i->by_name.at(name), std::move(state));
  }
  // Every stored position of a view, published for lookups (db::get) before any reader
  // or writer runs. Other names ("<view>#...", stream times) are not a view's.
  i->positions = std::make_unique<position_cache>(i->views.size());
  {
    const std::string prefix("pos\0", 4);  // "pos" 0x00 name 0x00 partition (4 bytes)
    std::unique_ptr<rocksdb::Iterator> it(i->rdb->NewIterator(rocksdb::ReadOptions(), i->meta));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      std::string_view k(it->key().data(), it->key().size());
      if (k.size() < prefix.size() + 5 || k[k.size() - 5] != '\0') continue;
      auto view = i->by_name.find(k.substr(prefix.size(), k.size() - prefix.size() - 5));
      if (view == i->by_name.end()) continue;
      auto part = decode_data_key(k.substr(k.size() - 4));
      auto off = decode_offset(std::string_view(it->value().data(), it->value().size()));
      // A malformed record stays unknown here: a lookup reads it, and says what is wrong.
      if (!part || !off) continue;
      if (auto* slot = i->positions->make(view->second, part->partition)) slot->position.store(*off);
    }
    if (auto s = from_rocks(it->status(), "reading positions"); !s.ok()) return s;
  }
  if (!i->expiry.empty() && opts.window_expiry_interval_ms > 0)
    i->start_expiry(std::chrono::milliseconds(opts.window_expiry_interval_ms));
  if (opts.verify_files_interval_ms > 0) i->start_verify(std::chrono::milliseconds(opts.verify_files_interval_ms));
  return std::unique_ptr<db>(new db(std::move(i)));
}

std::optional<view_id> db::find_view(std::string_view name) const {
  auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) return std::nullopt;
  return it->second;
}

const std::string& db::view_name(view_id id) const { return impl_->view_names.at(id); }

write_batch db::new_batch() const {
  auto b = std::make_unique<write_batch::impl>();
  b->owner = impl_.get();
  return write_batch(std::move(b));
}

namespace {

// Whether `dir` takes a new file of 1 MiB now (a read-only or full file system does not).
bool takes_writes(const std::string& dir) {
  const std::string probe = dir + "/.kstate-write-probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  static const std::string chunk(64 << 10, '\0');
  bool ok = true;
  for (int i = 0; i < 16 && ok; ++i) ok = ::write(fd, chunk.data(), chunk.size()) == static_cast<ssize_t>(chunk.size());
  ok = ::close(fd) == 0 && ok;
  (void)::unlink(probe.c_str());  // a probe left behind is harmless
  return ok;
}

}  // namespace

status db::resume() {
  auto s = from_rocks(impl_->rdb->Resume(), "resume");
  // Busy (unavailable): RocksDB is recovering by itself (a full disk is such an error).
  if (s.code() != status_code::io_error || !takes_writes(impl_->path)) {
    impl_->unrecovered = 0;
    return s;
  }
  // The directory takes writes, yet RocksDB does not recover, three times in a row: it
  // stopped for good.
  if (++impl_->unrecovered < 3) return s;
  std::lock_guard lock(impl_->damage_mu);
  if (impl_->damage.empty()) {
    impl_->damage = "RocksDB does not recover from '" + s.message() +
                    "' although the state directory takes writes again; only reopening the database clears it";
    storage_log()->error("{}", impl_->damage);
  }
  return s;
}

status db::write(write_batch& batch) {
  rocksdb::WriteOptions wo;
  wo.disableWAL = false;
  // sync=false: the WAL record is in the OS page cache when Write returns, which a
  // process crash (kill -9) cannot lose. Power loss may lose the newest batches, and
  // since positions travel in the same batch, ingest then re-reads exactly those.
  wo.sync = false;
  // A batch missing an operation must not be applied: its positions would pass it.
  if (!batch.impl_->failed.ok()) return batch.impl_->failed;
  auto& b = *batch.impl_;
  std::vector<published_stream_time> published;
  if (!b.versions.empty()) {
    // Placed now, against the state as written: the writes they depend on (earlier
    // batches) are all in. Undone when the write fails, so a retry places them afresh.
    b.batch.SetSavePoint();
    if (auto p = place_versions(*impl_->rdb, impl_->meta, impl_->views, impl_->view_names, impl_->versioned, b.versions,
                                b.arena, b.batch, published);
        !p.ok()) {
      if (auto r = b.batch.RollbackToSavePoint(); !r.ok()) return from_rocks(r, "undoing placed versions");
      return p;
    }
  }
  // The positions this batch moves are marked as being written for its whole write
  // (position_cache.h), then published, or left unknown when the write failed.
  std::vector<position_cache::slot*> slots;
  slots.reserve(b.positions.size());
  for (const auto& p : b.positions)
    if (auto* slot = impl_->positions->make(p.view, p.partition)) {
      position_cache::begin(*slot);
      slots.push_back(slot);
    } else {
      slots.push_back(nullptr);
    }
  auto s = from_rocks(impl_->rdb->Write(wo, &b.batch), "write");
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (slots[i]) position_cache::end(*slots[i], s.ok() ? b.positions[i].next_offset : position_cache::unknown);
  if (!b.versions.empty()) {
    if (!s.ok()) {
      if (auto r = b.batch.RollbackToSavePoint(); !r.ok()) return from_rocks(r, "undoing placed versions");
    } else {
      (void)b.batch.PopSavePoint();  // nothing to undo any more; a missing save point is harmless
      for (const auto& p : published) {
        std::lock_guard lock(p.state->mu);
        p.state->stream_time[p.partition] = p.time;
      }
    }
  }
  // Expiry follows stream time only once it is stored: a window is deleted from disk
  // only when the stored state says it has expired.
  if (s.ok())
    for (const auto& st : batch.impl_->stream_times) {
      std::lock_guard lock(st.view->mu);
      st.view->stream_time[st.partition] = st.time;
    }
  return s;
}

result<std::optional<int64_t>> db::stored_position(view_id view, int32_t partition) const {
  std::string v;
  auto s = impl_->rdb->Get(rocksdb::ReadOptions(), impl_->meta,
                           encode_position_key(impl_->view_names.at(view), partition), &v);
  if (s.IsNotFound()) return std::optional<int64_t>();
  if (!s.ok()) return from_rocks(s, "reading position");
  auto off = decode_offset(v);
  if (!off) return status::corruption("position record has " + std::to_string(v.size()) + " bytes");
  return std::optional<int64_t>(*off);
}

result<std::optional<int64_t>> db::stored_named_position(std::string_view name, int32_t partition) const {
  std::string v;
  auto s = impl_->rdb->Get(rocksdb::ReadOptions(), impl_->meta, encode_position_key(name, partition), &v);
  if (s.IsNotFound()) return std::optional<int64_t>();
  if (!s.ok()) return from_rocks(s, "reading position");
  auto off = decode_offset(v);
  if (!off) return status::corruption("position record has " + std::to_string(v.size()) + " bytes");
  return std::optional<int64_t>(*off);
}

result<db::identity> db::instance_id(std::string_view where) {
  std::string id, stored_where;
  auto s = impl_->rdb->Get(rocksdb::ReadOptions(), impl_->meta, id_key, &id);
  if (!s.ok() && !s.IsNotFound()) return from_rocks(s, "reading instance id");
  const bool had_id = s.ok();
  if (had_id) {
    auto w = impl_->rdb->Get(rocksdb::ReadOptions(), impl_->meta, where_key, &stored_where);
    if (!w.ok() && !w.IsNotFound()) return from_rocks(w, "reading instance id");
    // An id kept before its place was: adopted, with the place it is in now.
    if (w.ok() && stored_where == where) return identity{id, false, false};
    if (w.IsNotFound()) {
      rocksdb::WriteOptions wo;
      wo.sync = true;
      if (auto p = impl_->rdb->Put(wo, impl_->meta, where_key, rocksdb::Slice(where.data(), where.size())); !p.ok())
        return from_rocks(p, "writing instance id");
      return identity{id, false, false};
    }
  }
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
  rocksdb::WriteBatch b;
  if (auto p = b.Put(impl_->meta, id_key, buf); !p.ok()) return from_rocks(p, "writing instance id");
  if (auto p = b.Put(impl_->meta, where_key, rocksdb::Slice(where.data(), where.size())); !p.ok())
    return from_rocks(p, "writing instance id");
  rocksdb::WriteOptions wo;
  wo.sync = true;
  if (auto w = impl_->rdb->Write(wo, &b); !w.ok()) return from_rocks(w, "writing instance id");
  return identity{std::string(buf), had_id, !had_id};
}

result<get_result> db::get(view_id view, int32_t partition, std::string_view key) const {
  // The value and the partition's position in one MultiGet over the view's and the meta
  // column families. Without a snapshot in the options, RocksDB reads every column
  // family of a MultiGet at one sequence number, so both come from the same write, as
  // with an explicit snapshot; but taking and releasing a snapshot locks the DB mutex,
  // which the HTTP threads would contend on for every lookup.
  partition_prefix prefix(partition);
  std::string data_key;
  data_key.reserve(4 + key.size());
  data_key.append(prefix.bytes, 4).append(key);
  // The value alone, with the position published in memory, when no write moved that
  // position while the value was read (position_cache.h).
  if (auto t = impl_->positions->enter(view, partition)) {
    rocksdb::PinnableSlice value;
    auto st = impl_->rdb->Get(rocksdb::ReadOptions(), impl_->views.at(view), data_key, &value);
    if (position_cache::still(*t)) {
      if (!st.ok() && !st.IsNotFound()) return from_rocks(st, "get");
      impl_->cached_position_reads.fetch_add(1, std::memory_order_relaxed);
      get_result out;
      if (st.ok()) {
        const int64_t ttl = impl_->ttl_ms[view];
        if (ttl == 0 || !value_expired(std::string_view(value.data(), value.size()), ttl, impl_->clock()))
          out.value = value.ToString();
      }
      if (t->position != position_cache::absent) out.position = t->position;
      return out;
    }
  }
  std::string pos_key = encode_position_key(impl_->view_names.at(view), partition);
  rocksdb::ColumnFamilyHandle* cfs[2] = {impl_->views.at(view), impl_->meta};
  rocksdb::Slice keys[2] = {rocksdb::Slice(data_key), rocksdb::Slice(pos_key)};
  rocksdb::PinnableSlice values[2];
  rocksdb::Status statuses[2];
  impl_->rdb->MultiGet(rocksdb::ReadOptions(), 2, cfs, keys, values, statuses);
  get_result out;
  if (statuses[0].ok()) {
    // The clock is read only for a view with a ttl: other lookups pay nothing for it.
    const int64_t ttl = impl_->ttl_ms[view];
    if (ttl == 0 || !value_expired(std::string_view(values[0].data(), values[0].size()), ttl, impl_->clock()))
      out.value = values[0].ToString();
  } else if (!statuses[0].IsNotFound()) return from_rocks(statuses[0], "get");
  if (statuses[1].ok()) out.position = decode_offset(std::string_view(values[1].data(), values[1].size()));
  else if (!statuses[1].IsNotFound()) return from_rocks(statuses[1], "get position");
  return out;
}

uint64_t db::cached_position_reads() const { return impl_->cached_position_reads.load(std::memory_order_relaxed); }

result<view_stats> db::stats(view_id view) const {
  view_stats out;
  auto* h = impl_->views.at(view);
  auto prop = [&](const std::string& name, uint64_t& v) {
    if (!impl_->rdb->GetIntProperty(h, name, &v)) v = 0;  // unsupported property: report 0
  };
  prop(rocksdb::DB::Properties::kEstimateNumKeys, out.estimated_keys);
  prop(rocksdb::DB::Properties::kLiveSstFilesSize, out.live_sst_bytes);
  prop(rocksdb::DB::Properties::kTotalSstFilesSize, out.total_sst_bytes);
  prop(rocksdb::DB::Properties::kCurSizeAllMemTables, out.memtable_bytes);
  prop(rocksdb::DB::Properties::kEstimatePendingCompactionBytes, out.pending_compaction_bytes);
  prop(rocksdb::DB::Properties::kNumRunningCompactions, out.running_compactions);
  prop(rocksdb::DB::Properties::kNumRunningFlushes, out.running_flushes);
  if (auto it = impl_->expiry.find(view); it != impl_->expiry.end())
    out.expired_windows = it->second->expired.load(std::memory_order_relaxed);
  if (auto it = impl_->ttl.find(view); it != impl_->ttl.end())
    out.expired_keys = it->second->expired.load(std::memory_order_relaxed);
  if (auto it = impl_->versioned.find(view); it != impl_->versioned.end()) {
    // The versions are part of the store's size (not of its keys).
    auto add = [&](const std::string& name, uint64_t& v) {
      uint64_t more = 0;
      if (impl_->rdb->GetIntProperty(it->second->cf, name, &more)) v += more;
    };
    add(rocksdb::DB::Properties::kLiveSstFilesSize, out.live_sst_bytes);
    add(rocksdb::DB::Properties::kTotalSstFilesSize, out.total_sst_bytes);
    add(rocksdb::DB::Properties::kCurSizeAllMemTables, out.memtable_bytes);
    add(rocksdb::DB::Properties::kEstimatePendingCompactionBytes, out.pending_compaction_bytes);
    out.expired_versions = it->second->expired.load(std::memory_order_relaxed);
    out.late_versions = it->second->late.load(std::memory_order_relaxed);
  }
  return out;
}

db_stats db::stats() const {
  db_stats out;
  out.block_cache_capacity = impl_->cache->GetCapacity();
  out.block_cache_usage = impl_->cache->GetUsage();
  out.block_cache_pinned = impl_->cache->GetPinnedUsage();
  auto& st = *impl_->statistics;
  out.block_cache_hits = st.getTickerCount(rocksdb::BLOCK_CACHE_HIT);
  out.block_cache_misses = st.getTickerCount(rocksdb::BLOCK_CACHE_MISS);
  out.write_stall_micros = st.getTickerCount(rocksdb::STALL_MICROS);
  out.bytes_written = st.getTickerCount(rocksdb::BYTES_WRITTEN);
  out.bytes_read = st.getTickerCount(rocksdb::BYTES_READ);
  if (!impl_->rdb->GetIntProperty(rocksdb::DB::Properties::kBackgroundErrors, &out.background_errors))
    out.background_errors = 0;
  return out;
}

std::string db::rocksdb_version() {
  return std::to_string(ROCKSDB_MAJOR) + "." + std::to_string(ROCKSDB_MINOR) + "." + std::to_string(ROCKSDB_PATCH);
}

status db::flush() {
  rocksdb::FlushOptions fo;
  fo.wait = true;
  std::vector<rocksdb::ColumnFamilyHandle*> all(impl_->handles.begin(), impl_->handles.end());
  return from_rocks(impl_->rdb->Flush(fo, all), "flush");
}

}  // namespace kstate::storage
