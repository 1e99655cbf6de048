// The owner's writer thread (ingest/src/apply_stage.h) and the builder's hand-over of a
// batch (batch_builder::take): batches are written whole and in the order built, the
// queue is bounded, drain() waits for every write, and a failed write stops the stage.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "apply_stage.h"
#include "core/value_codec.h"
#include "ingest/batch_builder.h"
#include "storage/db.h"

using namespace kstate;
using namespace kstate::ingest;
using namespace std::chrono_literals;

namespace {

struct store {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kstate-apply-" + std::to_string(std::random_device{}()));
  std::vector<view_def> views{view_def{.name = "t", .topic = "topic", .value_format = data_format::string}};
  std::unique_ptr<storage::db> db = std::move(storage::db::open({.path = dir.string()}, {"t"}).value());
  ~store() {
    db.reset();
    std::filesystem::remove_all(dir);
  }
};

record rec(int32_t p, int64_t off, std::string_view k, std::string_view v) { return record{"topic", p, off, k, v}; }

}  // namespace

TEST_CASE("take: hands over the batch with its positions and counts, and starts an empty one") {
  store s;
  auto b = std::move(batch_builder::create(*s.db, s.views).value());
  b->add(rec(0, 0, "a", "1"));
  b->add(rec(0, 1, "b", "2"));
  b->add(rec(1, 0, "a", "3"));
  auto taken = b->take();
  CHECK(taken.records == 3);
  CHECK(taken.touched == std::map<std::pair<std::string, int32_t>, int64_t>{{{"topic", 0}, 2}, {{"topic", 1}, 1}});
  CHECK(taken.partition_counts.at({"topic", 0}).applied == 2);
  // The state changes and one position per touched partition.
  CHECK(taken.batch.operation_count() == 5);
  CHECK(b->pending_records() == 0);
  CHECK(b->batch().empty());
  // The next batch continues where the first left off: its positions are written anew.
  b->add(rec(0, 2, "c", "4"));
  auto second = b->take();
  CHECK(second.touched == std::map<std::pair<std::string, int32_t>, int64_t>{{{"topic", 0}, 3}});
  CHECK(second.batch.operation_count() == 2);
  REQUIRE(s.db->write(taken.batch).ok());
  REQUIRE(s.db->write(second.batch).ok());
  auto view = *s.db->find_view("t");
  CHECK(*s.db->stored_position(view, 0).value() == 3);
  CHECK(*s.db->stored_position(view, 1).value() == 1);
  auto got = s.db->get(view, 0, "c");
  REQUIRE(got.ok());
  CHECK(unframe_value(*got->value)->value == "4");
}

TEST_CASE("apply_stage: batches are applied in the order submitted, and drain() waits for all of them") {
  store s;
  auto b = std::move(batch_builder::create(*s.db, s.views).value());
  std::mutex mu;
  std::vector<int64_t> order;
  apply_stage stage(
      [&](built_batch& bb) {
        std::this_thread::sleep_for(2ms);  // slower than the producer below: batches queue up
        std::lock_guard lock(mu);
        order.push_back(bb.touched.begin()->second);
        return s.db->write(bb.batch).ok();
      },
      size_t{64} << 20);
  for (int64_t i = 0; i < 50; ++i) {
    b->add(rec(0, i, "k" + std::to_string(i % 7), std::to_string(i)));
    REQUIRE(stage.submit(b->take(stage.recycled())));
  }
  REQUIRE(stage.drain());
  std::vector<int64_t> want;
  for (int64_t i = 1; i <= 50; ++i) want.push_back(i);
  CHECK(order == want);
  // The last write of every key won, and the position is the last batch's.
  auto view = *s.db->find_view("t");
  CHECK(*s.db->stored_position(view, 0).value() == 50);
  for (int k = 0; k < 7; ++k) {
    int64_t last = 0;
    for (int64_t i = 0; i < 50; ++i)
      if (i % 7 == k) last = i;
    auto got = s.db->get(view, 0, "k" + std::to_string(k));
    CHECK(unframe_value(*got->value)->value == std::to_string(last));
  }
}

TEST_CASE("apply_stage: full at the byte bound, drained below half of it") {
  store s;
  auto b = std::move(batch_builder::create(*s.db, s.views).value());
  std::atomic<bool> release{false};
  apply_stage stage(
      [&](built_batch&) {
        while (!release) std::this_thread::sleep_for(1ms);
        return true;
      },
      4096);
  const std::string value(400, 'v');
  // The first batch is taken by the thread (and held); the queue fills behind it.
  int submitted = 0;
  for (; !stage.full() && submitted < 1000; ++submitted) {
    b->add(rec(0, submitted, "k", value));
    REQUIRE(stage.submit(b->take()));
    if (submitted == 0) std::this_thread::sleep_for(50ms);
  }
  CHECK(stage.full());
  CHECK_FALSE(stage.drained());
  CHECK(submitted < 20);  // about 4096 bytes of batches of ~430 bytes, not a thousand
  release = true;
  REQUIRE(stage.drain());
  CHECK_FALSE(stage.full());
  CHECK(stage.drained());
}

TEST_CASE("apply_stage: after a failed write nothing more is applied, and drain() says so") {
  store s;
  auto b = std::move(batch_builder::create(*s.db, s.views).value());
  std::atomic<int> calls{0};
  apply_stage stage(
      [&](built_batch&) {
        ++calls;
        return calls < 3;  // the third write fails
      },
      size_t{64} << 20);
  for (int64_t i = 0; i < 10; ++i) {
    b->add(rec(0, i, "k", "v"));
    (void)stage.submit(b->take());
  }
  CHECK_FALSE(stage.drain());
  CHECK(stage.failed());
  CHECK(calls == 3);
  b->add(rec(0, 10, "k", "v"));
  CHECK_FALSE(stage.submit(b->take()));
  stage.stop();
  CHECK(calls == 3);
}

TEST_CASE("apply_stage: an exception in a write stops the stage instead of the process") {
  store s;
  auto b = std::move(batch_builder::create(*s.db, s.views).value());
  apply_stage stage([&](built_batch&) -> bool { throw std::runtime_error("disk on fire"); }, size_t{1} << 20);
  b->add(rec(0, 0, "k", "v"));
  REQUIRE(stage.submit(b->take()));
  CHECK_FALSE(stage.drain());
  CHECK(stage.failed());
}

TEST_CASE("apply_stage: stop() applies what was submitted before it") {
  store s;
  auto b = std::move(batch_builder::create(*s.db, s.views).value());
  std::atomic<int> applied{0};
  {
    apply_stage stage(
        [&](built_batch&) {
          std::this_thread::sleep_for(1ms);
          ++applied;
          return true;
        },
        size_t{64} << 20);
    for (int64_t i = 0; i < 20; ++i) {
      b->add(rec(0, i, "k", "v"));
      REQUIRE(stage.submit(b->take()));
    }
    stage.stop();
    CHECK(applied == 20);
  }
}
