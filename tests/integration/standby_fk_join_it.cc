// Standby copies of foreign-key join views: with standby_replicas 1 each instance
// follows, for the other's partitions, both changelogs of the view (the left rows',
// partitioned as the repartition topic, and the right side's, partitioned as the
// subscription topic). When the owner is killed, allow_stale reads answer from the
// copy, and the survivor takes both sides over restoring only the changelog tails the
// copies had not applied (here none): without the copies it would read at least one
// changelog record per order key and per customer key of those partitions. Then more
// input, joined by the survivor. Every answer against a model computed from the final
// tables.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <thread>

#include "fk_common.h"
#include "standby_common.h"

using namespace kstate::testing;

TEST_CASE(
    "standby copies of foreign-key join views follow both changelogs: stale reads while the owner is down, and a "
    "fail-over that restores only the tails") {
  const int order_partitions = 4, customer_partitions = 3;
  auto orders = unique_name("sbfk-orders"), customers = unique_name("sbfk-customers");
  create_topic(orders, order_partitions);
  create_topic(customers, customer_partitions);
  auto app = unique_name("sbfk-app");
  // A left join and a projection without the record cache (a changelog record per
  // update): both store topics of each, and both inputs, are partitions of the group.
  const auto all = fk_views(orders, customers);
  const std::vector<kstate_process::view> views{all[1], all[2]};
  const std::vector<std::string> names{"fk_left", "fk_select"};
  const int partitions = 3 * (order_partitions + customer_partitions);
  auto left_topic = [&](const std::string& view) { return app + "-" + view + "-repartition"; };
  auto right_topic = [&](const std::string& view) { return app + "-" + view + "-subscription"; };

  auto dir = temp_dir("sbfk");
  const std::string extra = "standby_replicas: 1\nprocessing_guarantee: exactly_once\n";
  kstate_process a(app, views, dir + "/a", extra);
  kstate_process b(app, views, dir + "/b", extra);
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  auto both_own = [&] { return cluster_settled(a.port(), 2, partitions) && owners(a.port()).size() == 2; };
  for (int i = 0; i < 600 && !both_own(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(both_own());
  // The instance killed later ("B") owns partitions of both sides of a view; the other
  // ("A") keeps the standby copies of them.
  auto side_parts = [](const std::set<std::pair<std::string, int>>& parts, const std::string& topic) {
    std::set<int> out;
    for (const auto& [t, p] : parts)
      if (t == topic) out.insert(p);
    return out;
  };
  auto covers_both = [&](const std::set<std::pair<std::string, int>>& parts) {
    for (const auto& v : names)
      if (!side_parts(parts, left_topic(v)).empty() && !side_parts(parts, right_topic(v)).empty()) return true;
    return false;
  };
  const auto split = owners(a.port());
  kstate_process& victim = covers_both(split.at(b.endpoint())) ? b : a;
  kstate_process& survivor = &victim == &b ? a : b;
  REQUIRE(covers_both(split.at(victim.endpoint())));
  // Per view, the partitions of each side B owns.
  std::map<std::string, std::set<int>> b_left, b_right;
  for (const auto& v : names) {
    b_left[v] = side_parts(split.at(victim.endpoint()), left_topic(v));
    b_right[v] = side_parts(split.at(victim.endpoint()), right_topic(v));
    MESSAGE("the instance killed later owns " << b_left[v].size() << " of " << order_partitions << " partitions of "
                                              << v << "'s left side and " << b_right[v].size() << " of "
                                              << customer_partitions << " of its right side");
  }

  // Orders that change customer, tombstones on both sides, values naming no customer.
  const int order_keys = 300, customer_keys = 100;
  std::vector<produced> orec, crec;
  make_input(61, 3000, order_keys, customer_keys, orec, crec);
  fk_model m;
  int customer_changes = 0, order_tombstones = 0, customer_tombstones = 0;
  for (const auto& r : orec) {
    auto before = m.orders.find(*r.key);
    std::optional<std::string> had, names_now;
    if (before != m.orders.end()) had = named_customer(json::parse(before->second));
    if (r.value) names_now = named_customer(json::parse(*r.value));
    else ++order_tombstones;
    if (had && names_now && *had != *names_now) ++customer_changes;
    apply_record(m.orders, r);
  }
  for (const auto& r : crec) {
    if (!r.value) ++customer_tombstones;
    apply_record(m.customers, r);
  }
  REQUIRE(customer_changes > 0);
  REQUIRE(order_tombstones > 0);
  REQUIRE(customer_tombstones > 0);

  // The data comes while B owns its partitions: on A only the standby copies have it.
  // A left record's copy keeps its partition number in the repartition topic, and a
  // right record's in the subscription topic.
  const auto at_orders = produce_bytes(orders, orec);
  const auto at_customers = produce_bytes(customers, crec);
  // Per view, the order and customer keys of B's partitions of each side.
  std::map<std::string, std::set<std::string>> b_orders, b_customers;
  for (const auto& v : names) {
    for (size_t i = 0; i < orec.size(); ++i)
      if (b_left[v].count(at_orders[i].first)) b_orders[v].insert(*orec[i].key);
    for (size_t i = 0; i < crec.size(); ++i)
      if (b_right[v].count(at_customers[i].first)) b_customers[v].insert(*crec[i].key);
  }

  auto wrong = wait_equal(survivor.port(), m, names, std::chrono::seconds(180));
  for (const auto& v : wrong) MESSAGE(v << " differs from the model; see " << a.log_path() << ", " << b.log_path());
  REQUIRE(wrong.empty());

  // The copies follow the changelogs on their own: give them a moment to reach the end.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  auto restored = [&](const std::string& store) {
    return metric_with(survivor.port(), "kstate_restore_records_total", "store=\"" + store + "\"");
  };
  std::map<std::string, double> before;
  for (const auto& v : names) {
    before[v] = restored(v);
    before[v + "#fk"] = restored(v + "#fk");
  }

  victim.kill9();
  // Until the session timeout B is the owner on record but does not answer: pages and
  // key lookups read B's partitions from A's copy, and equal the model.
  // Pages read B's left partitions from the copy (marked stale) and A's from A.
  for (const auto& v : names) {
    auto stale = read_pages(survivor.port(), v, "&allow_stale=true");
    REQUIRE(stale);
    CHECK(stale->first == expected(m, v));
    MESSAGE(stale->second << " stale pages of " << v << " from the standby copy");
    CHECK((stale->second > 0) == !b_left[v].empty());
  }
  CHECK(check_gets(survivor.port(), m, names, order_keys, "?allow_stale=true") == 0);

  // A takes everything over: the restores read only what the copies had not applied.
  bool alone = false;
  for (int i = 0; i < 300 && !alone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    alone = cluster_settled(survivor.port(), 1, partitions);
  }
  REQUIRE(alone);
  // Without the copies: at least one changelog record per key of B's partitions (a
  // side B did not own has nothing to restore either way).
  bool both_sides_moved = false;
  for (const auto& v : names) {
    const double left = restored(v) - before[v], right = restored(v + "#fk") - before[v + "#fk"];
    const auto lk = b_orders[v].size(), rk = b_customers[v].size();
    MESSAGE("fail-over restored " << left << " changelog records of " << v << "'s left rows (" << lk
                                  << " order keys in B's partitions) and " << right << " of its right side (" << rk
                                  << " customer keys)");
    CHECK(left * 10 <= static_cast<double>(lk));
    CHECK(right * 10 <= static_cast<double>(rk));
    both_sides_moved = both_sides_moved || (lk > 40 && rk > 20);
  }
  CHECK(both_sides_moved);
  // Every answer now comes from the survivor's own partitions (not stale).
  wrong = wait_equal(survivor.port(), m, names, std::chrono::seconds(60));
  for (const auto& v : wrong) MESSAGE(v << " differs from the model after the fail-over; see " << survivor.log_path());
  CHECK(wrong.empty());
  for (const auto& v : names) {
    auto own = read_pages(survivor.port(), v, "");
    REQUIRE(own);
    CHECK(own->second == 0);
  }
  CHECK(check_gets(survivor.port(), m, names, order_keys) == 0);

  // More input after the fail-over: the survivor joins it on both restored sides.
  std::vector<produced> omore, cmore;
  make_input(62, 600, order_keys, customer_keys, omore, cmore);
  produce(orders, omore);
  produce(customers, cmore);
  for (const auto& r : omore) apply_record(m.orders, r);
  for (const auto& r : cmore) apply_record(m.customers, r);
  wrong = wait_equal(survivor.port(), m, names, std::chrono::seconds(180));
  for (const auto& v : wrong) MESSAGE(v << " differs from the model after more input; see " << survivor.log_path());
  CHECK(wrong.empty());
  CHECK(check_gets(survivor.port(), m, names, order_keys) == 0);
  CHECK(survivor.terminate() == 0);
}
