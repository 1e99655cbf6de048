// Retention of a windowed view against the real broker: once event time has moved past
// a window's end plus retention, the window is no longer answered, and the expiry pass
// deletes it from disk: the store's files shrink to about the share of windows still
// live. Expected windows come from a model of the produced events.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {

constexpr int64_t k_base = 1'796'205'600'000;  // 2026-12-02T10:00:00Z
constexpr int k_keys = 3'000;
constexpr int k_windows = 100;  // one-second windows 0..99 after k_base
constexpr int64_t k_size = 1'000;
constexpr int64_t k_retention = 30'000;

std::string key_name(int k) {
  char buf[16];
  snprintf(buf, sizeof buf, "key-%04d", k);
  return buf;
}

// Bytes of the RocksDB table files under `dir`.
uint64_t sst_bytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".sst") n += e.file_size();
  return n;
}

// Every window of the store over HTTP, paged: key -> starts.
std::map<std::string, std::vector<int64_t>> read_windows(uint16_t port, const std::string& store) {
  std::map<std::string, std::vector<int64_t>> out;
  http_client http(port);
  std::string cursor;
  for (;;) {
    auto a = http.get("/v1/stores/" + store + "/windows?from=0&limit=1000" +
                      (cursor.empty() ? "" : "&cursor=" + pct(cursor)));
    REQUIRE(a);
    REQUIRE(a->status == 200);
    auto body = a->body_json();
    for (const auto& w : body["data"]) {
      CHECK(w["value"].get<int64_t>() == 1);
      out[w["key"].get<std::string>()].push_back(w["start"].get<int64_t>());
    }
    if (body["metadata"]["next"].is_null()) break;
    cursor = body["metadata"]["next"].get<std::string>();
  }
  return out;
}

}  // namespace

TEST_CASE("windows past retention are not answered and leave the disk") {
  const std::string topic = unique_name("ticks");
  create_topic(topic, 3);

  // One record per key per one-second window, in event-time order (nothing is late).
  std::vector<produced> records;
  records.reserve(k_keys * k_windows);
  for (int w = 0; w < k_windows; ++w)
    for (int k = 0; k < k_keys; ++k) records.push_back({key_name(k), "{}", k_base + w * k_size + k % 1000});
  auto where = produce_bytes(topic, records);

  // Model: stream time per partition, then which windows are live at the end.
  std::map<int32_t, int64_t> stream_time;
  std::map<std::string, int32_t> partition_of;
  for (size_t i = 0; i < records.size(); ++i) {
    auto p = where[i].first;
    stream_time[p] = std::max(stream_time[p], *records[i].timestamp);
    partition_of[*records[i].key] = p;
  }
  std::map<std::string, std::vector<int64_t>> live;
  size_t expired = 0, live_count = 0;
  for (int k = 0; k < k_keys; ++k)
    for (int w = 0; w < k_windows; ++w) {
      const int64_t start = k_base + w * k_size;
      if (start + k_size + k_retention <= stream_time.at(partition_of.at(key_name(k)))) {
        ++expired;
      } else {
        live[key_name(k)].push_back(start);
        ++live_count;
      }
    }
  REQUIRE(expired > live_count);  // about 69 of every 100 windows

  const std::string app = unique_name("retain");
  const std::string state = temp_dir("kstate-retain");
  const std::vector<kstate_process::view> views{
      {"per_second", topic, "json", "", "string", "kind: count, window: {type: tumbling, size: 1s, retention: 30s}"}};

  // Memtables large enough for every window, so that RocksDB flushes (and compacts)
  // only at shutdown: before the expiry pass, all windows are on disk.
  const std::string memory = "block_cache_mb: 256, write_buffer_manager_mb: 128, write_buffer_mb: 128";

  // Phase 1: no expiry pass. Expired windows are already not answered.
  double expired_phase1 = 0;
  {
    kstate_process ks(app, views, state, "rocksdb: {" + memory + ", window_expiry_interval_ms: 0}\n");
    ks.start();
    ks.wait_ready();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
    while (ks.position_sum("per_second") < static_cast<int64_t>(records.size()) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    REQUIRE(ks.position_sum("per_second") == static_cast<int64_t>(records.size()));
    CHECK(read_windows(ks.port(), "per_second") == live);
    // RocksDB may have compacted some files on its own, deleting expired windows there.
    expired_phase1 = ks.metric_sum("kstate_store_expired_windows_total");
    REQUIRE(ks.terminate() == 0);  // flushes the memtables into table files
  }
  const uint64_t before = sst_bytes(state);
  REQUIRE(before > 0);

  // Phase 2: the same state with an expiry pass every 500 ms.
  kstate_process ks(app, views, state, "rocksdb: {" + memory + ", window_expiry_interval_ms: 500}\n");
  ks.start();
  ks.wait_ready();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (expired_phase1 + ks.metric_sum("kstate_store_expired_windows_total") < static_cast<double>(expired) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  // Each expired window was deleted once: by RocksDB's own compactions or by the pass.
  CHECK(expired_phase1 + ks.metric_sum("kstate_store_expired_windows_total") == static_cast<double>(expired));
  // Obsolete table files are removed right after the compaction that replaced them.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const uint64_t after = sst_bytes(state);
  // Windows in the table files before the pass: all but those RocksDB already dropped.
  const double on_disk = static_cast<double>(live_count + expired) - expired_phase1;
  const double live_share = static_cast<double>(live_count) / on_disk;
  MESSAGE("table files: " << before << " -> " << after << " bytes; " << expired << " of " << live_count + expired
                          << " windows expired (" << expired_phase1 << " before the expiry pass)");
  CHECK(static_cast<double>(after) < static_cast<double>(before) * (live_share + 0.1));
  CHECK(read_windows(ks.port(), "per_second") == live);
  // The store's description gives the window definition and the same count.
  auto d = http_client(ks.port()).get("/v1/stores/per_second");
  REQUIRE(d);
  REQUIRE(d->status == 200);
  auto store = d->body_json();
  CHECK(store["window"] == json{{"type", "tumbling"},
                                {"size_ms", k_size},
                                {"advance_ms", k_size},
                                {"grace_ms", 0},
                                {"retention_ms", k_retention}});
  CHECK(store["expired_windows"].get<double>() == ks.metric_sum("kstate_store_expired_windows_total"));
  CHECK(ks.terminate() == 0);
}
