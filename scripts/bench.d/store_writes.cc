// The store's own write limit for scripts/bench: what kstate's storage layer writes per
// second with one writer and nothing else, so the ingest figure can be read against the
// ceiling it cannot pass.
//
//   store_writes DIR RECORDS KEYS PARTITIONS [BATCH]
//
// Opens kstate's storage::db in DIR (an empty directory) with kstate's default options
// (the ones the server uses without configuration), one view "bench", and writes
// RECORDS records over KEYS keys exactly as the bench's producer makes them (16-byte
// keys "k" + 15 digits, 100-byte JSON values; the first KEYS records write every key
// once, the rest pick keys uniformly), each framed with its offset as ingest stores it,
// in batches of BATCH records (default 10,000, ingest's max_batch_records) that end with
// the position of every partition they touched. Keys go to partition hash % PARTITIONS.
// Compaction runs as it does in the server. The clock and the CPU time run from the
// first write to the last one, flushes and compactions that are still running then
// included in the CPU time only as far as they got.
//
// Prints one JSON line: records, seconds, rps, cpu_s.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/value_codec.h"
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

  kstate::storage::db_options opts;
  opts.path = dir;
  auto opened = kstate::storage::db::open(opts, {"bench"});
  if (!opened.ok()) {
    std::fprintf(stderr, "store_writes: %s\n", opened.error().to_string().c_str());
    return 1;
  }
  auto& db = *opened.value();
  const auto view = *db.find_view("bench");

  std::mt19937_64 rnd(1);
  std::vector<int64_t> next(static_cast<std::size_t>(partitions), 0);
  std::vector<bool> touched(static_cast<std::size_t>(partitions), false);
  std::string key, value;
  auto batch = db.new_batch();
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_seconds();
  for (uint64_t seq = 0; seq < records;) {
    for (uint64_t n = 0; n < batch_records && seq < records; ++n, ++seq) {
      const uint64_t id = seq < keys ? seq : rnd() % keys;
      make_key(key, id);
      make_value(value, id, seq);
      const auto p = static_cast<std::size_t>(std::hash<std::string>{}(key) % static_cast<std::size_t>(partitions));
      const auto frame = kstate::frame_header(next[p]++);
      batch.put(view, static_cast<int32_t>(p), key, std::string_view(frame.data(), frame.size()), value);
      touched[p] = true;
    }
    for (std::size_t p = 0; p < touched.size(); ++p) {
      if (!touched[p]) continue;
      batch.set_position(view, static_cast<int32_t>(p), next[p]);
      touched[p] = false;
    }
    if (auto s = db.write(batch); !s.ok()) {
      std::fprintf(stderr, "store_writes: %s\n", s.to_string().c_str());
      return 1;
    }
    batch.clear();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = cpu_seconds() - c0;
  std::printf("{\"records\":%llu,\"seconds\":%.3f,\"rps\":%.0f,\"cpu_s\":%.3f}\n",
              static_cast<unsigned long long>(records), seconds, static_cast<double>(records) / seconds, cpu);
  return 0;
}
