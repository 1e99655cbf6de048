// The store ceiling of scripts/bench: point reads of the lookup keys, in process, on a
// copy of kstate's state directory, with kstate's table options (shared LRU block cache,
// bloom filter, partitioned index and filter blocks in the cache). No HTTP, no JSON.
//
//   rocks_reads DB_DIR COLUMN_FAMILY KEYFILE THREADS SECONDS CACHE_MB
//
// KEYFILE lines are "key<TAB>partition<TAB>present" (written by Fill); the stored key
// is kstate's: 4-byte big-endian partition, then the key bytes. Prints one JSON line:
// "get_rps" for one Get per lookup, and "kstate_like_rps" for what kstate's lookup does
// in storage (a snapshot, the value Get and the partition position Get), each with the
// CPU microseconds per lookup (the whole process over the run: "*_cpu_us"). Linked
// with RocksDB as kstate is (statically).
#include <sys/resource.h>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// CPU time of the whole process (every thread), seconds.
static double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

struct run_result {
  double rps, found, cpu_us;  // lookups per second, share found, CPU microseconds per lookup
};

static std::string encode(int partition, const std::string& key) {
  std::string out;
  auto p = static_cast<uint32_t>(partition);
  out.push_back(static_cast<char>(p >> 24));
  out.push_back(static_cast<char>(p >> 16));
  out.push_back(static_cast<char>(p >> 8));
  out.push_back(static_cast<char>(p));
  return out + key;
}

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: rocks_reads DB_DIR COLUMN_FAMILY KEYFILE THREADS SECONDS CACHE_MB\n");
    return 2;
  }
  std::string dir = argv[1], cf = argv[2];
  int threads = std::atoi(argv[4]);
  double seconds = std::atof(argv[5]);
  std::vector<std::string> keys;
  std::vector<std::string> pos_keys;
  {
    std::ifstream in(argv[3]);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string k;
      int p;
      if (f >> k >> p) keys.push_back(encode(p, k));
    }
  }
  if (keys.empty()) return std::fprintf(stderr, "rocks_reads: no keys\n"), 1;

  rocksdb::BlockBasedTableOptions table;
  rocksdb::LRUCacheOptions cache_opts;
  cache_opts.capacity = static_cast<size_t>(std::atoll(argv[6])) << 20;
  cache_opts.high_pri_pool_ratio = 0.1;
  table.block_cache = rocksdb::NewLRUCache(cache_opts);
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10, false));
  table.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
  table.partition_filters = true;
  table.metadata_block_size = 4096;
  table.pin_top_level_index_and_filter = true;
  table.format_version = 5;
  rocksdb::ColumnFamilyOptions cfo;
  cfo.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  rocksdb::DBOptions dbo;
  std::vector<std::string> names;
  auto s = rocksdb::DB::ListColumnFamilies(dbo, dir, &names);
  if (!s.ok()) return std::fprintf(stderr, "rocks_reads: %s\n", s.ToString().c_str()), 1;
  std::vector<rocksdb::ColumnFamilyDescriptor> descs;
  for (const auto& n : names) descs.emplace_back(n, cfo);
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  s = rocksdb::DB::OpenForReadOnly(dbo, dir, descs, &handles, &db);
  if (!s.ok()) return std::fprintf(stderr, "rocks_reads: %s\n", s.ToString().c_str()), 1;
  rocksdb::ColumnFamilyHandle *data = nullptr, *meta = nullptr;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == cf) data = handles[i];
    else if (names[i] != rocksdb::kDefaultColumnFamilyName) meta = handles[i];
  }
  if (!data) return std::fprintf(stderr, "rocks_reads: no column family %s\n", cf.c_str()), 1;

  auto run = [&](bool kstate_like) {
    std::atomic<bool> stop{false};
    std::atomic<long long> total{0}, found{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        long long n = 0, f = 0;
        std::string v;
        size_t i = static_cast<size_t>(t) * 7919 % keys.size();
        while (!stop.load(std::memory_order_relaxed)) {
          for (int j = 0; j < 256; ++j) {
            const std::string& k = keys[i];
            i = (i + 1) % keys.size();
            rocksdb::ReadOptions ro;
            const rocksdb::Snapshot* snap = nullptr;
            if (kstate_like) ro.snapshot = snap = db->GetSnapshot();
            if (db->Get(ro, data, k, &v).ok()) ++f;
            if (kstate_like) {
              if (meta) {
                // kstate's position key: "pos\0<view>\0" + the 4-byte partition.
                std::string pv, pk("pos");
                pk.push_back('\0');
                pk += cf;
                pk.push_back('\0');
                pk.append(k, 0, 4);
                auto ignored = db->Get(ro, meta, pk, &pv);  // found or not, only the cost counts
                (void)ignored;
              }
              db->ReleaseSnapshot(snap);
            }
            ++n;
          }
        }
        total += n;
        found += f;
      });
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
    for (auto& th : ts) th.join();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu_us = total ? (cpu_seconds() - c0) / static_cast<double>(total) * 1e6 : 0.0;
    return run_result{total / secs, total ? double(found) / total : 0.0, cpu_us};
  };
  run(false);  // warm the block cache
  auto plain = run(false);
  auto like = run(true);
  std::printf(
      "{\"get_rps\":%.0f,\"get_cpu_us\":%.3f,\"kstate_like_rps\":%.0f,\"kstate_like_cpu_us\":%.3f,"
      "\"found_ratio\":%.4f,\"threads\":%d}\n",
      plain.rps, plain.cpu_us, like.rps, like.cpu_us, plain.found, threads);
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
  delete db;
  return 0;
}
