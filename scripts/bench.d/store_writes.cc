// The store's own write limit for scripts/bench: what kstate's write path does per
// second with one thread and no Kafka, so the ingest figure can be read against it.
//
//   store_writes DIR RECORDS KEYS PARTITIONS [BATCH]
//
// Makes RECORDS records over KEYS keys exactly as the bench's producer does (16-byte
// keys "k" + 15 digits, 100-byte JSON values; the first KEYS records write every key
// once, the rest pick keys uniformly; partition hash % PARTITIONS), then, with the
// clock running, feeds them to kstate's own batch builder (validation, the stored
// layout, key order) in batches of BATCH records (default 10,000, ingest's
// max_batch_records) and writes each batch to kstate's storage::db in DIR (an empty
// directory) with kstate's default options, on one thread: build, write, build, write.
// Flushes and compactions run in RocksDB's threads as in the server; the CPU time counts
// them as far as they got when the last write returned.
//
// Prints one JSON line: records, seconds, rps, cpu_s.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "ingest/batch_builder.h"
#include "storage/db.h"

namespace {

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// The bench producer's key and value of key `id` at sequence number `seq` (Fill.java).
void make_key(std::string& out, uint64_t id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "k%015llu", static_cast<unsigned long long>(id));
  out.assign(buf);
}

void make_value(std::string& out, uint64_t id, uint64_t seq) {
  const std::string tail = "\",\"k\":" + std::to_string(id) + ",\"s\":" + std::to_string(seq) + "}";
  const std::size_t pad = 100 - 6 - tail.size();
  out.assign("{\"a\":\"");
  for (std::size_t i = 0; i < pad; ++i) out += static_cast<char>('a' + (id + seq + i) % 26);
  out += tail;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: store_writes DIR RECORDS KEYS PARTITIONS [BATCH]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const uint64_t records = std::strtoull(argv[2], nullptr, 10);
  const uint64_t keys = std::strtoull(argv[3], nullptr, 10);
  const int32_t partitions = std::atoi(argv[4]);
  const uint64_t batch_records = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 10'000;
  if (records == 0 || keys == 0 || partitions <= 0 || batch_records == 0) {
    std::fprintf(stderr, "store_writes: RECORDS, KEYS, PARTITIONS and BATCH must be positive\n");
    return 2;
  }

  // The records, made before the clock starts: the producer's work is not the store's.
  std::vector<std::string> keys_of(records), values_of(records);
  std::vector<int32_t> partition_of(records);
  std::vector<int64_t> offset_of(records);
  {
    std::mt19937_64 rnd(1);
    std::vector<int64_t> next(static_cast<std::size_t>(partitions), 0);
    for (uint64_t seq = 0; seq < records; ++seq) {
      const uint64_t id = seq < keys ? seq : rnd() % keys;
      make_key(keys_of[seq], id);
      make_value(values_of[seq], id, seq);
      const auto p = std::hash<std::string>{}(keys_of[seq]) % static_cast<std::size_t>(partitions);
      partition_of[seq] = static_cast<int32_t>(p);
      offset_of[seq] = next[p]++;
    }
  }

  kstate::storage::db_options opts;
  opts.path = dir;
  auto opened = kstate::storage::db::open(opts, {"bench"});
  if (!opened.ok()) {
    std::fprintf(stderr, "store_writes: %s\n", opened.error().to_string().c_str());
    return 1;
  }
  auto& db = *opened.value();
  const std::vector<kstate::view_def> views{kstate::view_def{.name = "bench", .topic = "bench"}};
  auto builder = std::move(kstate::ingest::batch_builder::create(db, views).value());

  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_seconds();
  for (uint64_t seq = 0; seq < records;) {
    for (uint64_t n = 0; n < batch_records && seq < records; ++n, ++seq)
      builder->add(kstate::ingest::record{"bench", partition_of[seq], offset_of[seq], keys_of[seq], values_of[seq]});
    auto b = builder->take();
    if (auto s = db.write(b.batch); !s.ok()) {
      std::fprintf(stderr, "store_writes: %s\n", s.to_string().c_str());
      return 1;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = cpu_seconds() - c0;
  std::printf("{\"records\":%llu,\"seconds\":%.3f,\"rps\":%.0f,\"cpu_s\":%.3f}\n",
              static_cast<unsigned long long>(records), seconds, static_cast<double>(records) / seconds, cpu);
  return 0;
}
