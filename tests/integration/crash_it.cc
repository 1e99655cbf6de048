// kill -9 at random moments during ingest loses nothing and applies nothing twice:
// state and position are written in one RocksDB batch, and ingest resumes from the
// stored position.
#include <doctest/doctest.h>

#include <atomic>
#include <random>
#include <thread>

#include "fault_common.h"
#include "support.h"

using namespace kstate::testing;

// The long version (scripts/chaos): 10,000,000 records and at least 50 kills.
TEST_CASE("kill -9 during ingest of 1,000,000 records: the final state equals the model exactly") {
  const int total = long_run() ? 10'000'000 : 1'000'000, keys = 100'000, chunks = long_run() ? 50 : 10, partitions = 6,
            min_kills = long_run() ? 50 : 5;
  tally t{"kstate kill -9 soak"};
  auto topic = unique_name("crash");
  create_topic(topic, partitions);

  std::mt19937 rng(7);
  std::uniform_int_distribution<int> pick(0, keys - 1), pct100(0, 99);
  std::vector<std::vector<produced>> parts(chunks);
  table_model model;
  for (int i = 0; i < total; ++i) {
    produced r{"user-" + std::to_string(pick(rng)), std::nullopt};
    if (pct100(rng) >= 5) r.value = R"({"seq":)" + std::to_string(i) + "}";
    apply_record(model, r);
    parts[i / (total / chunks)].push_back(std::move(r));
  }

  std::atomic<int> produced_chunks{0};
  std::thread producer([&] {
    for (auto& p : parts) {
      produce(topic, p);
      ++produced_chunks;
    }
  });

  auto dir = temp_dir("crash");
  kstate_process ks(unique_name("crash-app"), {{"t", topic}}, dir + "/state");
  // A static member id: a restart takes the partitions back at once instead of waiting
  // for the killed member's session to time out, so the kills come while the records
  // are still being produced.
  ks.extra_args({"--set", "kafka.group.instance.id=crash"});
  std::uniform_int_distribution<int> delay_ms(50, 1500);
  int kills = 0, kills_mid_ingest = 0;

  // While records are being produced and consumed: start, let it ingest a random
  // while after the group assigned it partitions, kill -9.
  while (produced_chunks < chunks || kills < min_kills) {
    ks.start();
    REQUIRE_MESSAGE(wait_assigned(ks, std::chrono::seconds(60)), "no assignment; see " << ks.log_path());
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    auto before = ks.position_sum("t");
    ks.kill9();
    ++kills;
    if (before >= 0 && before < total) ++kills_mid_ingest;
    MESSAGE("kill " << kills << " at applied position " << before << ", chunks produced " << produced_chunks.load());
  }
  producer.join();

  // Everything is produced now: kill a few more times while it catches up.
  std::uniform_int_distribution<int> short_delay(0, 300);
  for (int i = 0; i < 2; ++i) {
    ks.start();
    REQUIRE(wait_assigned(ks, std::chrono::seconds(60)));
    std::this_thread::sleep_for(std::chrono::milliseconds(short_delay(rng)));
    auto before = ks.position_sum("t");
    ks.kill9();
    ++kills;
    if (before >= 0 && before < total) ++kills_mid_ingest;
    MESSAGE("kill " << kills << " at applied position " << before << " (catching up)");
  }
  CHECK(kills >= min_kills);
  CHECK(kills_mid_ingest >= 5);
  t.runs = kills;

  ks.start();
  ks.wait_ready();
  REQUIRE(ks.position_sum("t") == total);

  http_client c(ks.port());
  size_t checked = 0;
  for (int k = 0; k < keys; ++k) {
    auto key = "user-" + std::to_string(k);
    auto a = c.get("/v1/stores/t/keys/" + key);
    REQUIRE(a);
    auto it = model.find(key);
    const bool ok =
        it == model.end() ? a->status == 404 : a->status == 200 && a->body_json()["value"] == json::parse(it->second);
    if (!ok && ++t.lost <= 5) MESSAGE(key << ": " << a->status << " " << a->body);
    ++checked;
  }
  CHECK(checked == static_cast<size_t>(keys));
  t.checked = static_cast<int64_t>(checked);
  t.notes = std::to_string(total) + " records, " + std::to_string(kills_mid_ingest) + " kills before the end";
  t.report();

  // A clean restart with nothing new to read consumes nothing: it resumes from the
  // stored positions, not from the beginning.
  CHECK(ks.terminate() == 0);
  ks.start();
  ks.wait_ready();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  CHECK(ks.metric_sum("kstate_ingest_records_consumed_total") == 0);
  CHECK(ks.position_sum("t") == total);
  CHECK(ks.terminate() == 0);
}
