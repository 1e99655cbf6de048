// The hand-over from a standby copy to the owner on the same instance is fenced: once
// standby_engine::release() returned, in time or not, no write of the copy lands for the
// partitions taken over, so a late batch of the copy can never overwrite newer values
// (and positions) the owner wrote; and once the owner gives a partition up, the copy
// keeps it again.
//
// The standby engine and the owner's ingest engine run in this process against the real
// broker, sharing one RocksDB, as in a kstate instance. The group membership the standby
// follows is published by the test: another member ("http://a") owns both topics'
// partitions and this instance ("http://b") keeps their copies. The standby's test hook
// holds a batch of the copy back past the release deadline, so the race a stalled write
// used to lose happens on every run.
#include <doctest/doctest.h>

#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "core/membership.h"
#include "core/notifier.h"
#include "core/ownership.h"
#include "core/value_codec.h"
#include "ingest/engine.h"
#include "ingest/standby.h"
#include "storage/db.h"
#include "support.h"

using namespace kstate;
using namespace kstate::testing;
using namespace std::chrono_literals;
using tp = std::pair<std::string, int32_t>;

namespace {

constexpr int keys = 2000;

std::vector<produced> generation(int n) {
  std::vector<produced> out;
  for (int k = 0; k < keys; ++k)
    out.push_back({"k" + std::to_string(k), R"({"k":)" + std::to_string(k) + R"(,"gen":)" + std::to_string(n) + "}"});
  return out;
}

// Waits (generously: the machine may be loaded) until `done` holds; fails the test otherwise.
template <typename F>
void wait_until(const char* what, F done) {
  for (int i = 0; i < 1200 && !done(); ++i) std::this_thread::sleep_for(100ms);
  REQUIRE_MESSAGE(done(), "timed out waiting until " << what);
}

int64_t stored(const storage::db& db, const std::string& view) {
  auto p = db.stored_position(*db.find_view(view), 0);
  REQUIRE(p.ok());
  return p.value().value_or(-1);
}

// The view's partition 0 against the model (last write wins) and its position.
void check_view(const storage::db& db, const std::string& view, const table_model& model, int64_t position) {
  CHECK_MESSAGE(stored(db, view) == position, "position of " << view);
  for (const auto& [key, value] : model) {
    auto got = db.get(*db.find_view(view), 0, key);
    REQUIRE(got.ok());
    REQUIRE_MESSAGE(got.value().value, view << "/" << key << " missing");
    auto f = unframe_value(*got.value().value);
    REQUIRE(f);
    CHECK_MESSAGE(std::string(f->value) == value, view << "/" << key);
  }
}

// Holds back batches of the copy, on the standby thread: first the very first batch
// (while it is held, the consumer keeps fetching both partitions in small, interleaved
// fetches), then the first batch after it that touches `partition`.
class write_gate {
 public:
  explicit write_gate(tp partition) : partition_(std::move(partition)) {}
  void before_write(const std::vector<tp>& touched) {
    std::unique_lock lock(mu_);
    bool hold = stage_ == 0 || (stage_ == 1 && std::find(touched.begin(), touched.end(), partition_) != touched.end());
    if (!hold) return;
    ++stage_;
    holding_ = true;
    held_with_ = {touched.begin(), touched.end()};
    cv_.notify_all();
    cv_.wait(lock, [&] { return !holding_; });
  }
  bool holding() {
    std::lock_guard lock(mu_);
    return holding_;
  }
  std::set<tp> held_with() {
    std::lock_guard lock(mu_);
    return held_with_;
  }
  void let_go() {
    std::lock_guard lock(mu_);
    holding_ = false;
    cv_.notify_all();
  }

 private:
  tp partition_;
  std::mutex mu_;
  std::condition_variable cv_;
  int stage_ = 0;  // batches held so far
  bool holding_ = false;
  std::set<tp> held_with_;
};

}  // namespace

TEST_CASE("a standby write held back past the release deadline never lands over the new owner's writes") {
  auto taken = unique_name("handover-taken");  // the owner takes its partition over
  auto kept = unique_name("handover-kept");    // the copy keeps this one
  create_topic(taken, 1);
  create_topic(kept, 1);
  table_model taken_model, kept_model;
  // produce_bytes: the Java client's own small batches (linger.ms 0), so that fetches
  // return the partitions in interleaved chunks (see the copy's settings below).
  for (int gen = 1; gen <= 2; ++gen) {
    auto recs = generation(gen);
    produce_bytes(taken, recs);
    produce_bytes(kept, recs);
    for (const auto& r : recs) {
      apply_record(taken_model, r);
      apply_record(kept_model, r);
    }
  }

  auto dir = temp_dir("handover");
  auto opened = storage::db::open({.path = dir + "/state", .block_cache_bytes = 8 << 20}, {"s", "u"});
  REQUIRE(opened.ok());
  auto& db = *opened.value();
  view_def s{.name = "s", .topic = taken}, u{.name = "u", .topic = kept};
  ownership_registry ownership;
  ownership.set_partition_count(taken, 1);
  ownership.set_partition_count(kept, 1);
  membership_registry membership;
  cluster_snapshot group;
  group.version = 1;
  group.group_state = "Stable";
  group.members = {member_info{"a", "a", "http://a", "host", {{kept, 0}, {taken, 0}}},
                   member_info{"b", "b", "http://b", "host", {}}};
  membership.publish(group);
  change_notifier notifier;

  ingest::ingest_config cfg;
  cfg.bootstrap_servers = bootstrap();
  cfg.application_id = unique_name("handover-app");
  cfg.standby_release_timeout = 200ms;
  // Small fetches and batches for the copy, so its queue interleaves both partitions
  // and the batch held at the hand-over holds records of both: then the kept partition
  // must be read again after that batch is dropped.
  auto standby_cfg = cfg;
  standby_cfg.kafka = {{"max.partition.fetch.bytes", "4096"}};
  standby_cfg.max_batch_records = 1000;
  ingest::standby_engine standby(standby_cfg, {s, u}, db, ownership, membership, "http://b", 1, &notifier);
  write_gate gate({taken, 0});
  standby.set_before_write_for_testing([&](const std::vector<tp>& touched) { gate.before_write(touched); });
  REQUIRE(standby.start().ok());
  wait_until("the copy has its first batch ready", [&] { return gate.holding(); });
  std::this_thread::sleep_for(3s);  // not an assertion: time for the consumer to prefetch
  gate.let_go();
  wait_until("the copy has a batch of the taken partition ready to write", [&] { return gate.holding(); });
  WARN_MESSAGE(gate.held_with().size() == 2, "the held batch touches only the taken partition");

  // This instance becomes the owner of `taken`: release() waits 200 ms for the stalled
  // copy, then the owner reads the stored position and applies.
  cfg.before_assign = [&](const std::vector<tp>& parts) { standby.release(parts); };
  cfg.after_revoke = [&](const std::vector<tp>& parts) { standby.give_back(parts); };
  ingest::engine owner(cfg, {s}, db, ownership, nullptr, &notifier);
  REQUIRE(owner.start().ok());
  wait_until("the owner applied the first two generations", [&] { return stored(db, "s") == 2 * keys; });
  auto third = generation(3);
  produce_bytes(taken, third);
  for (const auto& r : third) apply_record(taken_model, r);
  wait_until("the owner applied the third generation", [&] { return stored(db, "s") == 3 * keys; });

  // The copy's held batch (generations 1 and 2) goes on now. Once the copy no longer
  // holds `taken`, that batch has been written or dropped.
  gate.let_go();
  wait_until("the copy gave the taken partition up", [&] {
    auto held = standby.partitions();
    return std::find(held.begin(), held.end(), tp{taken, 0}) == held.end();
  });
  wait_until("the copy of the kept partition caught up", [&] { return stored(db, "u") == 2 * keys; });
  check_view(db, "s", taken_model, 3 * keys);
  check_view(db, "u", kept_model, 2 * keys);
  CHECK(owner.fatal_error().empty());

  // The owner gives the partition up (it leaves the group): the copy keeps it again,
  // from where the owner stopped.
  owner.stop();
  auto fourth = generation(4);
  produce_bytes(taken, fourth);
  for (const auto& r : fourth) apply_record(taken_model, r);
  wait_until("the copy caught up with the given-back partition", [&] { return stored(db, "s") == 4 * keys; });
  check_view(db, "s", taken_model, 4 * keys);
  standby.stop();
}
