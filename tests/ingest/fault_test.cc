// Faults injected into the ingest and standby threads, against librdkafka's mock cluster
// (rdkafka_mock.h: fault injection only; the integration tests use the real broker).
//
// Exceptions from hooks and change_notifier subscribers must end as a fatal error with
// its cause (ingest) or stopped copies (standby), never std::terminate; dead letters the
// broker refuses for good arrive as envelopes, or are counted, and ingest goes on.
#include <doctest/doctest.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <prometheus/registry.h>

#include <filesystem>
#include <random>
#include <stdexcept>
#include <thread>

#include "core/membership.h"
#include "core/notifier.h"
#include "core/ownership.h"
#include "ingest/engine.h"
#include "ingest/standby.h"
#include "storage/db.h"

using namespace kstate;
using namespace kstate::ingest;
using namespace std::chrono_literals;

namespace {

constexpr int16_t produce_api = 0;  // the Kafka protocol's ProduceRequest

// A one-broker mock cluster, and a producer to fill its topics.
class mock_kafka {
 public:
  mock_kafka() {
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    REQUIRE(rd_kafka_conf_set(conf, "log_level", "2", err, sizeof err) == RD_KAFKA_CONF_OK);
    handle_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    REQUIRE(handle_);
    cluster_ = rd_kafka_mock_cluster_new(handle_, 1);
    REQUIRE(cluster_);
    conf = rd_kafka_conf_new();
    REQUIRE(rd_kafka_conf_set(conf, "bootstrap.servers", bootstraps().c_str(), err, sizeof err) == RD_KAFKA_CONF_OK);
    producer_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    REQUIRE(producer_);
  }
  ~mock_kafka() {
    rd_kafka_destroy(producer_);
    rd_kafka_mock_cluster_destroy(cluster_);
    rd_kafka_destroy(handle_);
  }
  std::string bootstraps() const { return rd_kafka_mock_cluster_bootstraps(cluster_); }
  void create_topic(const std::string& name, int partitions) {
    REQUIRE(rd_kafka_mock_topic_create(cluster_, name.c_str(), partitions, 1) == RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  // Produces to partition 0 and waits for the acknowledgements.
  void produce(const std::string& topic, const std::vector<std::pair<std::string, std::string>>& records) {
    for (const auto& [k, v] : records)
      REQUIRE(
          rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(0),
                            RD_KAFKA_V_KEY(k.data(), k.size()), RD_KAFKA_V_VALUE(const_cast<char*>(v.data()), v.size()),
                            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR_NO_ERROR);
    REQUIRE(rd_kafka_flush(producer_, 30'000) == RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  // Until `lead(topic, partition, 1)`: the partition has no leader, so nothing can be
  // produced to it (LEADER_NOT_AVAILABLE, which retrying can change).
  void lead(const std::string& topic, int32_t partition, int32_t broker) {
    REQUIRE(rd_kafka_mock_partition_set_leader(cluster_, topic.c_str(), partition, broker) ==
            RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  // The records in partition 0 of `topic` (its high watermark).
  int64_t records_in(const std::string& topic) {
    int64_t low = 0, high = 0;
    REQUIRE(rd_kafka_query_watermark_offsets(producer_, topic.c_str(), 0, &low, &high, 10'000) ==
            RD_KAFKA_RESP_ERR_NO_ERROR);
    return high;
  }
  // The next `errors.size()` produce requests (of any client) fail with these errors.
  void fail_produce_requests(const std::vector<rd_kafka_resp_err_t>& errors) {
    rd_kafka_mock_push_request_errors_array(cluster_, produce_api, errors.size(), errors.data());
  }

 private:
  rd_kafka_t* handle_ = nullptr;
  rd_kafka_mock_cluster_t* cluster_ = nullptr;
  rd_kafka_t* producer_ = nullptr;
};

struct state {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kstate-ingest-fault-" + std::to_string(std::random_device{}()));
  std::unique_ptr<storage::db> db;
  explicit state(const std::vector<std::string>& views) {
    auto opened = storage::db::open({.path = dir.string(), .block_cache_bytes = 8 << 20}, views);
    REQUIRE(opened.ok());
    db = std::move(opened.value());
  }
  ~state() {
    db.reset();
    std::filesystem::remove_all(dir);
  }
};

ingest_config config(const mock_kafka& kafka) {
  ingest_config cfg;
  cfg.bootstrap_servers = kafka.bootstraps();
  cfg.application_id = "fault-" + std::to_string(std::random_device{}());
  cfg.startup_timeout = 30s;
  return cfg;
}

// Waits (generously) until `done` holds; fails the test otherwise.
template <typename F>
void wait_until(const char* what, F done) {
  for (int i = 0; i < 1200 && !done(); ++i) std::this_thread::sleep_for(50ms);
  REQUIRE_MESSAGE(done(), "timed out waiting until " << what);
}

// Waits until view "v" has stored `next` as its position on partition 0: every record
// below it written.
void wait_written(const state& st, int64_t next) {
  wait_until("the batch is written", [&] {
    auto pos = st.db->stored_position(*st.db->find_view("v"), 0);
    return pos.ok() && pos.value() == std::optional<int64_t>(next);
  });
}

double counter_sum(prometheus::Registry& registry, const std::string& name) {
  double sum = 0;
  for (const auto& family : registry.Collect())
    if (family.name == name)
      for (const auto& m : family.metric) sum += m.counter.value;
  return sum;
}

double gauge_value(prometheus::Registry& registry, const std::string& name) {
  for (const auto& family : registry.Collect())
    if (family.name == name && !family.metric.empty()) return family.metric[0].gauge.value;
  return -1;
}

}  // namespace

TEST_CASE("an exception thrown by a rebalance hook stops ingest with its cause, not std::terminate") {
  mock_kafka kafka;
  kafka.create_topic("events", 2);
  state st({"v"});
  ownership_registry ownership;
  auto cfg = config(kafka);
  cfg.before_assign = [](const auto&) { throw std::runtime_error("before_assign failed on purpose"); };
  engine e(cfg, {view_def{.name = "v", .topic = "events"}}, *st.db, ownership, nullptr);
  REQUIRE(e.start().ok());
  wait_until("the engine failed", [&] { return !e.fatal_error().empty(); });
  CHECK(e.fatal_error().find("before_assign failed on purpose") != std::string::npos);
  e.stop();  // returns: the loop stopped cleanly
}

TEST_CASE("an exception thrown by a change_notifier subscriber stops ingest with its cause, after the write") {
  mock_kafka kafka;
  kafka.create_topic("events", 1);
  kafka.produce("events", {{"a", "1"}, {"b", "2"}});
  state st({"v"});
  ownership_registry ownership;
  change_notifier notifier;
  notifier.subscribe([] { throw std::runtime_error("subscriber failed on purpose"); });
  engine e(config(kafka), {view_def{.name = "v", .topic = "events"}}, *st.db, ownership, nullptr, &notifier);
  REQUIRE(e.start().ok());
  wait_until("the engine failed", [&] { return !e.fatal_error().empty(); });
  CHECK(e.fatal_error().find("subscriber failed on purpose") != std::string::npos);
  e.stop();
  // The subscriber heard of a write that had happened: the first batch (one record or
  // both, as the consumer fetched them) is stored, with its position, before the stop.
  const auto view = *st.db->find_view("v");
  auto pos = st.db->stored_position(view, 0);
  REQUIRE(pos.ok());
  REQUIRE(pos.value().has_value());
  const int64_t stored = *pos.value();
  CHECK((stored == 1 || stored == 2));
  CHECK(st.db->get(view, 0, "a")->value.has_value());
  CHECK(st.db->get(view, 0, "b")->value.has_value() == (stored == 2));
}

TEST_CASE("a dead letter the broker refuses for good arrives as an envelope, or is counted; ingest goes on") {
  mock_kafka kafka;
  kafka.create_topic("events", 1);
  kafka.create_topic("dlq", 1);
  // Two valid records around an invalid one (not JSON).
  kafka.produce("events", {{"a", R"({"n":1})"}, {"b", "{not json"}, {"c", R"({"n":3})"}});
  state st({"v"});
  ownership_registry ownership;
  prometheus::Registry metrics;
  const view_def v{.name = "v", .topic = "events", .dead_letter_topic = "dlq"};

  SUBCASE("refused once: the envelope is delivered") {
    kafka.fail_produce_requests({RD_KAFKA_RESP_ERR_INVALID_RECORD});
    engine e(config(kafka), {v}, *st.db, ownership, &metrics);
    REQUIRE(e.start().ok());
    wait_written(st, 3);
    CHECK(e.stats().dead_lettered == 1);
    CHECK(e.stats().dead_letters_truncated == 1);
    CHECK(e.stats().dead_letters_failed == 0);
    CHECK(counter_sum(metrics, "kstate_ingest_dead_letters_truncated_total") == 1);
    CHECK(e.fatal_error().empty());
    e.stop();
  }
  SUBCASE("refused for the envelope too: counted as failed, the batch still written") {
    kafka.fail_produce_requests(
        {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED});
    engine e(config(kafka), {v}, *st.db, ownership, &metrics);
    REQUIRE(e.start().ok());
    wait_written(st, 3);
    CHECK(e.stats().dead_lettered == 0);
    CHECK(e.stats().dead_letters_failed == 1);
    CHECK(counter_sum(metrics, "kstate_ingest_dead_letters_failed_total") == 1);
    CHECK(e.stats().applied == 2);
    CHECK(e.fatal_error().empty());
    e.stop();
  }
}

TEST_CASE("a dead-letter topic that refuses writes for a while: ingest waits, then delivers each once") {
  mock_kafka kafka;
  kafka.create_topic("events", 1);
  kafka.create_topic("dlq", 1);
  kafka.produce("events", {{"a", R"({"n":1})"}, {"b", "{not json"}, {"c", R"({"n":3})"}});
  state st({"v"});
  ownership_registry ownership;
  prometheus::Registry metrics;
  // No leader for the dead-letter topic: a failure of Kafka's that retrying can change.
  // Each attempt of librdkafka's ends within 500 ms (message.timeout.ms), so kstate's
  // own retries run many rounds.
  kafka.lead("dlq", 0, -1);
  auto cfg = config(kafka);
  cfg.kafka["message.timeout.ms"] = "500";
  engine e(cfg, {view_def{.name = "v", .topic = "events", .dead_letter_topic = "dlq"}}, *st.db, ownership, &metrics);
  REQUIRE(e.start().ok());
  wait_until("the dead letter waits", [&] { return gauge_value(metrics, "kstate_ingest_dead_letters_waiting") == 1; });
  std::this_thread::sleep_for(3s);
  // Nothing written past the dead letter (offset 1; the record before it may have come
  // in a batch of its own), nothing given up, no error.
  auto pos = st.db->stored_position(*st.db->find_view("v"), 0);
  REQUIRE(pos.ok());
  CHECK(pos.value().value_or(0) <= 1);
  CHECK(!st.db->get(*st.db->find_view("v"), 0, "c")->value.has_value());
  CHECK(e.stats().dead_letters_failed == 0);
  CHECK(gauge_value(metrics, "kstate_ingest_dead_letters_waiting") == 1);
  CHECK(e.fatal_error().empty());

  kafka.lead("dlq", 0, 1);
  wait_written(st, 3);
  CHECK(e.stats().dead_lettered == 1);
  CHECK(e.stats().dead_letters_failed == 0);
  CHECK(gauge_value(metrics, "kstate_ingest_dead_letters_waiting") == 0);
  CHECK(kafka.records_in("dlq") == 1);  // once, whatever the retries
  e.stop();
}

TEST_CASE("an exception on the standby thread stops the copies with a metric, not the process") {
  mock_kafka kafka;
  kafka.create_topic("events", 1);
  kafka.produce("events", {{"a", "1"}});
  state st({"v"});
  ownership_registry ownership;
  ownership.set_partition_count("events", 1);
  membership_registry membership;
  cluster_snapshot group;
  group.version = 1;
  group.members = {member_info{"a", "a", "http://a", "host", {{"events", 0}}},
                   member_info{"b", "b", "http://b", "host", {}}};
  membership.publish(group);
  change_notifier notifier;
  notifier.subscribe([] { throw std::runtime_error("subscriber failed on purpose"); });
  prometheus::Registry metrics;
  standby_engine standby(config(kafka), {view_def{.name = "v", .topic = "events", .value_format = data_format::string}},
                         *st.db, ownership, membership, "http://b", 1, &notifier, &metrics);
  REQUIRE(standby.start().ok());
  wait_until("the copies stopped", [&] { return counter_sum(metrics, "kstate_standby_failures_total") == 1; });
  CHECK(standby.partitions().empty());
  // A hand-over to an owner does not wait for copies that are gone.
  standby.release({{"events", 0}});
  standby.stop();
}
