// kill -9 while the writer thread has batches queued or is writing one: ingest reads
// ahead of what is written (ingest/src/apply_stage.h), and whatever was read but not
// written is read again after the restart, never lost and never applied twice.
//
// One topic feeds a table and an exactly-once count of the same keys. A small writer
// queue (ingest.max_queued_mb: 1) and small memtables (a flush every MiB) keep the
// writer behind the ingest thread, which waits for room all the time. Each kill comes the moment /metrics shows batches
// waiting for the writer or being written. At the end the table equals the model, each value carries the offset of the
// record that wrote it last, every count equals the number of records of its key (a record applied twice would count
// twice), and the stored positions are the topic's end offsets.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {

double scrape(kstate_process& ks, const std::string& metric) {
  http_client c(ks.port());
  auto a = c.get("/metrics");
  if (!a || a->status != 200) return -1;
  std::istringstream in(a->body);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(metric + " ", 0) == 0) return std::stod(line.substr(metric.size() + 1));
  return -1;
}

}  // namespace

TEST_CASE("kill -9 with batches waiting for the writer, 10 times: table, counts and positions equal the model") {
  const int total = 1'000'000, keys = 20'000, partitions = 6;
  const auto topic = unique_name("writer-crash");
  create_topic(topic, partitions);

  std::mt19937 rng(11);
  std::uniform_int_distribution<int> pick(0, keys - 1);
  std::vector<produced> records;
  records.reserve(total);
  table_model model;
  std::map<std::string, int64_t> counts;
  for (int i = 0; i < total; ++i) {
    produced r{"k" + std::to_string(pick(rng)), R"({"seq":)" + std::to_string(i) + "}"};
    apply_record(model, r);
    ++counts[*r.key];
    records.push_back(std::move(r));
  }
  // Where each record landed: the offset of each key's last record is what its value
  // must say it was written by.
  auto where = produce_bytes(topic, records);
  REQUIRE(where.size() == records.size());
  std::map<std::string, int64_t> last_offset;
  std::map<int32_t, int64_t> end;
  for (size_t i = 0; i < records.size(); ++i) {
    last_offset[*records[i].key] = where[i].second;
    end[where[i].first] = std::max(end[where[i].first], where[i].second + 1);
  }

  const auto dir = temp_dir("writer-crash");
  kstate_process ks(unique_name("writer-crash-app"),
                    {{"t", topic}, {.name = "c", .topic = topic, .extra = "kind: count, cache: true"}}, dir + "/state");
  // A static member id: each restart takes its partitions back at once instead of
  // waiting for the killed member's session to time out. Memtables of 1 MiB make the
  // writer flush (and stall on compactions) often, so that it falls behind the ingest
  // thread and batches wait for it.
  ks.extra_args({"--set", "ingest.max_queued_mb=1", "--set", "kafka.group.instance.id=writer-crash", "--set",
                 "rocksdb.write_buffer_mb=1", "--set", "ingest.max_batch_records=2000"});

  int kills = 0, kills_with_batches_pending = 0;
  for (int attempt = 0; attempt < 40 && kills_with_batches_pending < 10; ++attempt) {
    ks.start();
    // Kill the moment /metrics shows batches waiting for the writer or being written:
    // ingest is running ahead of the writes.
    double pending = 0;
    int64_t applied = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while ((pending = scrape(ks, "kstate_ingest_write_queue_bytes")) <= 0 &&
           (applied = ks.position_sum("t")) < static_cast<int64_t>(total) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ks.kill9();
    ++kills;
    if (pending > 0) ++kills_with_batches_pending;
    MESSAGE("kill " << kills << ": " << pending << " bytes waiting for the writer or being written, table at "
                    << applied << " of " << total);
    if (applied >= static_cast<int64_t>(total)) break;  // caught up: nothing left to interrupt
  }
  CHECK(kills_with_batches_pending >= 10);

  ks.extra_args({"--set", "kafka.group.instance.id=writer-crash"});
  ks.start();
  ks.wait_ready(std::chrono::seconds(300));
  REQUIRE(ks.position_sum("t") == total);
  REQUIRE(ks.position_sum("c") >= 0);

  http_client c(ks.port());
  // The table: every key's value and the offset of the record that wrote it.
  for (const auto& [key, value] : model) {
    auto a = c.get("/v1/stores/t/keys/" + key);
    REQUIRE(a);
    REQUIRE_MESSAGE(a->status == 200, key << ": " << a->body);
    auto body = a->body_json();
    CHECK_MESSAGE(body["value"] == json::parse(value), key);
    CHECK_MESSAGE(body["offset"] == last_offset[key], key);
  }
  // The counts: a record applied twice would count twice.
  for (const auto& [key, n] : counts) {
    auto a = c.get("/v1/stores/c/keys/" + key);
    REQUIRE(a);
    REQUIRE_MESSAGE(a->status == 200, key << ": " << a->body);
    CHECK_MESSAGE(a->body_json()["value"] == n, key);
  }
  // Every partition's stored position is the topic's end.
  auto described = c.get("/v1/stores/t");
  REQUIRE(described);
  // Kept in a variable: a range-for over a member of the temporary would dangle.
  const auto description = described->body_json();
  for (const auto& p : description["assigned_partitions"]) CHECK(p["position"] == end[p["partition"].get<int32_t>()]);
  CHECK(ks.terminate() == 0);
}
