// Foreign-key join views against the real broker: orders naming customers by a field of
// their value, with random updates that change the foreign key, tombstones on both sides,
// values that name no customer, and inputs with different partition counts. Each view's
// answers (range pages, gets, counts, from either of two instances) against a model
// computed here from the final tables; a store that moves to an instance without its
// state is restored from the two changelogs; kill -9 during the input, then the same
// check after restart (exactly once: nothing lost, no stale answer left).
#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "fault_common.h"
#include "fk_common.h"
#include "ingest/fk_join.h"
#include "sse_client.h"

using namespace kstate::testing;

namespace {

const std::vector<std::string> views_checked{"fk_inner", "fk_left", "fk_select"};

int64_t restored_from_log(const std::string& path, const std::string& changelog_suffix) {
  std::ifstream log(path);
  int64_t restored = 0;
  for (std::string line; std::getline(log, line);) {
    auto at = line.find("] restored ");
    if (at != std::string::npos && line.find(changelog_suffix) != std::string::npos)
      restored += std::stoll(line.substr(at + 11));
  }
  return restored;
}

}  // namespace

TEST_CASE("foreign-key joins equal the model on two instances; a moved store is restored from both changelogs") {
  // Not co-partitioned: a foreign-key join does not need it.
  auto orders = unique_name("orders"), customers = unique_name("customers");
  create_topic(orders, 4);
  create_topic(customers, 3);
  const int order_keys = 200, customer_keys = 40;
  std::vector<produced> orec, crec;
  make_input(41, 2400, order_keys, customer_keys, orec, crec);
  fk_model m;
  for (const auto& r : orec) apply_record(m.orders, r);
  for (const auto& r : crec) apply_record(m.customers, r);

  auto app = unique_name("fk-app");
  auto dir = temp_dir("fk");
  kstate_process a(app, fk_views(orders, customers), dir + "/a");
  kstate_process b(app, fk_views(orders, customers), dir + "/b");
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  // Customers first for half, then orders before the customers they name.
  produce(customers, std::vector<produced>(crec.begin(), crec.begin() + 1200));
  produce(orders, std::vector<produced>(orec.begin(), orec.begin() + 1200));
  produce(orders, std::vector<produced>(orec.begin() + 1200, orec.end()));
  produce(customers, std::vector<produced>(crec.begin() + 1200, crec.end()));

  auto started = std::chrono::steady_clock::now();
  auto wrong = wait_equal(a.port(), m, views_checked, std::chrono::seconds(180));
  for (const auto& v : wrong) MESSAGE(v << " differs from the model; see " << a.log_path() << ", " << b.log_path());
  CHECK(wrong.empty());
  MESSAGE("joined in ~" << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s");
  CHECK(check_gets(a.port(), m, views_checked, order_keys) == 0);
  CHECK(check_gets(b.port(), m, views_checked, order_keys) == 0);
  {
    http_client h(b.port());
    for (const auto& view : views_checked) {
      auto count = h.get(std::string("/v1/stores/") + view + "/count");
      REQUIRE(count);
      REQUIRE(count->status == 200);
      CHECK(count->body_json()["count"] == expected(m, view).size());
    }
    auto info = h.get("/v1/stores/fk_left");
    REQUIRE(info);
    auto body = info->body_json();
    CHECK(body["join"]["foreign_key"] == "customer.id");
    CHECK(body["join"]["subscription_topic"] == app + "-fk_left-subscription");
  }
  // Orders naming no customer are counted, by reason.
  CHECK(a.metric_sum("kstate_join_unmatched_records_total") + b.metric_sum("kstate_join_unmatched_records_total") > 0);
  CHECK(a.metric_sum("kstate_ingest_records_invalid_total") == 0);

  // B leaves: A takes its partitions of both sides over without their state and
  // restores them from the changelogs; then more updates of both tables.
  CHECK(b.terminate() == 0);
  std::vector<produced> omore, cmore;
  make_input(42, 400, order_keys, customer_keys, omore, cmore);
  produce(orders, omore);
  produce(customers, cmore);
  for (const auto& r : omore) apply_record(m.orders, r);
  for (const auto& r : cmore) apply_record(m.customers, r);
  a.wait_ready();
  wrong = wait_equal(a.port(), m, views_checked, std::chrono::seconds(180));
  for (const auto& v : wrong) MESSAGE(v << " differs from the model after the move; see " << a.log_path());
  CHECK(wrong.empty());
  CHECK(check_gets(a.port(), m, views_checked, order_keys) == 0);
  // Both sides came from their changelogs.
  CHECK(restored_from_log(a.log_path(), "-subscription-changelog-") > 0);
  CHECK(restored_from_log(a.log_path(), "-changelog-") > restored_from_log(a.log_path(), "-subscription-changelog-"));
  CHECK(a.terminate() == 0);
}

TEST_CASE("kill -9 during the input: after restart every foreign-key join equals the model") {
  // KSTATE_FAULT_SCALE=long: ten times the input, at least 40 kills.
  const bool long_version = long_run();
  auto orders = unique_name("orders"), customers = unique_name("customers");
  create_topic(orders, 3);
  create_topic(customers, 2);
  const int order_keys = long_version ? 1200 : 120, customer_keys = long_version ? 300 : 30;
  std::vector<produced> orec, crec;
  make_input(51, long_version ? 40'000 : 4000, order_keys, customer_keys, orec, crec);
  fk_model m;
  for (const auto& r : orec) apply_record(m.orders, r);
  for (const auto& r : crec) apply_record(m.customers, r);

  auto app = unique_name("fk-crash");
  auto dir = temp_dir("fk-crash");
  kstate_process ks(app, fk_views(orders, customers), dir + "/state", "ingest: {max_batch_records: 200}\n");
  ks.extra_args({"-X", "group.instance.id=" + app + "-0"});
  const int chunks = long_version ? 40 : 8;
  std::atomic<int> produced_chunks{0};
  std::thread producer([&] {
    for (int c = 0; c < chunks; ++c) {
      auto slice = [&](const std::vector<produced>& all) {
        size_t n = all.size() / chunks;
        return std::vector<produced>(all.begin() + c * n, c == chunks - 1 ? all.end() : all.begin() + (c + 1) * n);
      };
      produce(orders, slice(orec));
      produce(customers, slice(crec));
      ++produced_chunks;
    }
  });
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> delay_ms(200, 1500);
  int kills = 0;
  const int min_kills = long_version ? 40 : 6;
  while (produced_chunks < chunks || kills < min_kills) {
    ks.start();
    REQUIRE_MESSAGE(wait_assigned(ks, std::chrono::seconds(60)), "no assignment; see " << ks.log_path());
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ks.kill9();
    ++kills;
  }
  producer.join();
  ks.start();
  ks.wait_ready();
  auto wrong = wait_equal(ks.port(), m, views_checked, std::chrono::seconds(180));
  for (const auto& v : wrong)
    MESSAGE(v << " differs from the model after " << kills << " kills; see " << ks.log_path());
  CHECK(wrong.empty());
  CHECK(check_gets(ks.port(), m, views_checked, order_keys) == 0);
  MESSAGE(kills << " kills");
  CHECK(ks.terminate() == 0);
}

TEST_CASE(
    "a late answer for a customer the order has left is dropped; foreign records on the internal topics are "
    "rejected") {
  // One order partition: the first record of the repartition topic is the order's first
  // copy, so its offset (the version of its first subscription) is 0.
  auto orders = unique_name("orders"), customers = unique_name("customers");
  create_topic(orders, 1);
  create_topic(customers, 2);
  auto app = unique_name("fk-late");
  auto dir = temp_dir("fk-late");
  kstate_process ks(app, {fk_views(orders, customers)[1]}, dir + "/state");
  ks.start();
  ks.wait_ready();
  fk_model m;
  auto step = [&](const std::string& topic, table_model& side, const produced& r) {
    produce(topic, {r});
    apply_record(side, r);
  };
  step(customers, m.customers, {"c1", json{{"name", "first"}}.dump()});
  step(customers, m.customers, {"c3", json{{"name", "second"}}.dump()});
  step(orders, m.orders, {"o1", json{{"amount", 5}, {"customer", {{"id", "c1"}}}}.dump()});
  auto joined_now = [&] { return read_store(ks.port(), "fk_left") == expected(m, "fk_left"); };
  for (int i = 0; i < 120 && !joined_now(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  REQUIRE(joined_now());
  const auto repartition = app + "-fk_left-repartition";
  auto first = consume_all(repartition, 1);
  REQUIRE(first.size() == 1);
  REQUIRE(first[0].key == "o1");
  REQUIRE(first[0].offset == 0);
  step(orders, m.orders, {"o1", json{{"amount", 6}, {"customer", {{"id", "c3"}}}}.dump()});
  for (int i = 0; i < 120 && !joined_now(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  REQUIRE(joined_now());

  // The answer of the first subscription (c1), arriving after the order moved to c3.
  kstate::ingest::fk_message late;
  late.kind = kstate::ingest::fk_message_kind::response;
  late.version = 0;
  late.value = json{{"name", "stale"}}.dump();
  auto at = produce_bytes(repartition, {{"o1", kstate::ingest::encode_fk_message(late)},
                                        {"o1", std::string("\x09not a record of this view")}});
  produce_bytes(app + "-fk_left-subscription", {{"c1", std::string("{\"not\":\"a subscription\"}")}});
  REQUIRE(at.size() == 2);
  // Applied (or dropped) once the store's position passes both records.
  for (int i = 0; i < 120 && ks.position_sum("fk_left") <= at[1].second; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  CHECK(ks.position_sum("fk_left") > at[1].second);
  CHECK(read_store(ks.port(), "fk_left") == expected(m, "fk_left"));
  // The two records that are no record of the view: rejected and counted, not applied.
  for (int i = 0; i < 40 && ks.metric_sum("kstate_ingest_records_invalid_total") < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  CHECK(ks.metric_sum("kstate_ingest_records_invalid_total") == 2);
  // A live view of the join: its snapshot is the model, then the change of the customer
  // the order names arrives as the order's new joined value.
  sse_stream feed(ks.port(), "/v1/stores/fk_left/changes?snapshot=true", "");
  std::map<std::string, json> live;
  auto apply = [&](const event& e) {
    const auto k = e.data["key"].get<std::string>();
    if (e.data["deleted"].get<bool>()) live.erase(k);
    else live[k] = e.data["value"];
  };
  for (const auto& e : read_until(
           feed, [](const std::vector<event>& ev) { return ev.back().type == "start"; }, std::chrono::seconds(60)))
    if (e.type == "snapshot") apply(e);
  CHECK(live == expected(m, "fk_left"));
  step(customers, m.customers, {"c3", json{{"name", "third"}}.dump()});
  read_until(
      feed,
      [&](const std::vector<event>& ev) {
        if (ev.back().type == "change") apply(ev.back());
        return live == expected(m, "fk_left");
      },
      std::chrono::seconds(60));
  CHECK(live == expected(m, "fk_left"));
  for (int i = 0; i < 120 && !joined_now(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(joined_now());
  CHECK(ks.terminate() == 0);
}
