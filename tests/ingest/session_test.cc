// Session windows: what one record does to its key's sessions (session_fold), and the
// merge of two aggregates it relies on, against a brute-force recomputation of the
// sessions from the records that were accepted.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "ingest/aggregation.h"
#include "session_fold.h"

using namespace kstate;
using namespace kstate::ingest;

namespace {

view_def make(view_kind k, reduce_op op = reduce_op::latest) {
  view_def v;
  v.name = "v";
  v.kind = k;
  v.topic = "t";
  v.reduce = op;
  if (k == view_kind::aggregate)
    v.fields = {agg_field::count, agg_field::sum, agg_field::min, agg_field::max, agg_field::mean};
  return v;
}

std::vector<view_def> every_kind() {
  return {make(view_kind::count),
          make(view_kind::sum),
          make(view_kind::reduce, reduce_op::latest),
          make(view_kind::reduce, reduce_op::min),
          make(view_kind::reduce, reduce_op::max),
          make(view_kind::aggregate)};
}

std::string fold_all(const aggregator& a, const std::vector<std::string>& values) {
  std::optional<std::string> state;
  for (const auto& v : values) {
    auto out = a.apply(state, v);
    REQUIRE(out.error.empty());
    state = out.state;
  }
  REQUIRE(state);
  return *state;
}

struct accepted {
  size_t seq;  // processing order
  int64_t t;
  std::string value;
};

// The sessions of `records` by definition: sorted by time, a new session wherever two
// neighbours are more than `gap` apart. Each with its records in processing order.
std::vector<std::vector<accepted>> sessions_by_definition(std::vector<accepted> records, int64_t gap) {
  std::stable_sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.t < b.t; });
  std::vector<std::vector<accepted>> out;
  for (size_t i = 0; i < records.size(); ++i) {
    if (i == 0 || records[i].t - records[i - 1].t > gap) out.emplace_back();
    out.back().push_back(records[i]);
  }
  for (auto& s : out) std::sort(s.begin(), s.end(), [](const auto& a, const auto& b) { return a.seq < b.seq; });
  return out;
}

std::pair<int64_t, int64_t> bounds(const std::vector<accepted>& s) {
  int64_t lo = s.front().t, hi = s.front().t;
  for (const auto& r : s) {
    lo = std::min(lo, r.t);
    hi = std::max(hi, r.t);
  }
  return {lo, hi};
}

}  // namespace

TEST_CASE("merging two aggregates equals folding both record sets, for every kind") {
  std::mt19937_64 rng(7);
  for (const auto& v : every_kind()) {
    aggregator agg(v, 64);
    CAPTURE(to_string(v.kind));
    for (int round = 0; round < 50; ++round) {
      std::vector<std::string> a, b;
      const int na = 1 + static_cast<int>(rng() % 5), nb = 1 + static_cast<int>(rng() % 5);
      for (int i = 0; i < na; ++i) a.push_back(std::to_string(static_cast<int64_t>(rng() % 200) - 100));
      for (int i = 0; i < nb; ++i) b.push_back(std::to_string(static_cast<int64_t>(rng() % 200) - 100));
      std::vector<std::string> both = a;
      both.insert(both.end(), b.begin(), b.end());
      auto merged = agg.merge(fold_all(agg, a), fold_all(agg, b));
      REQUIRE(merged.error.empty());
      // reduce latest keeps the newer aggregate's value: the last of `b`, as folding all does.
      CHECK(nlohmann::json::parse(merged.state) == nlohmann::json::parse(fold_all(agg, both)));
    }
    // A stored aggregate that is not what the view writes is an error, not a crash.
    CHECK_FALSE(agg.merge("{\"x\":", "1").error.empty());
  }
  aggregator agg(make(view_kind::aggregate), 64);
  CHECK_FALSE(agg.merge("{\"count\":1}", "{\"count\":1,\"sum\":2,\"min\":2,\"max\":2,\"mean\":2.0}").error.empty());
}

TEST_CASE("sessions folded record by record equal the sessions recomputed from the accepted records") {
  std::mt19937_64 rng(2026);
  for (const auto& v : every_kind()) {
    aggregator agg(v, 64);
    for (int round = 0; round < 40; ++round) {
      window_spec spec;
      spec.type = window_type::session;
      spec.gap_ms = 5 + static_cast<int64_t>(rng() % 40);
      spec.grace_ms = static_cast<int64_t>(rng() % 4) == 0 ? 0 : static_cast<int64_t>(rng() % 60);
      spec.retention_ms = 1'000'000'000;  // nothing expires here: expiry is not merging
      REQUIRE(normalize(spec).ok());
      CAPTURE(to_string(v.kind));
      CAPTURE(round);

      std::map<int64_t, stored_session> store;  // by start
      std::vector<accepted> records;
      int64_t stream_time = -1;
      int64_t clock = 1'000;
      size_t late = 0, merges = 0;
      for (size_t seq = 0; seq < 300; ++seq) {
        // Mostly forward in small steps, often out of order, sometimes far behind.
        int64_t t = 0;
        switch (rng() % 10) {
          case 0: t = std::max<int64_t>(0, clock - static_cast<int64_t>(rng() % 400)); break;
          case 1:
          case 2: t = std::max<int64_t>(0, clock - static_cast<int64_t>(rng() % (spec.gap_ms * 3))); break;
          default: t = clock += static_cast<int64_t>(rng() % (spec.gap_ms * 2));
        }
        const std::string value = std::to_string(static_cast<int64_t>(rng() % 100) - 50);
        const int64_t st = std::max(stream_time, t);
        std::vector<stored_session> joined;
        for (const auto& [start, s] : store)
          if (session_reaches(spec, s.start, s.last, t)) joined.push_back(s);
        auto change = fold_session(agg, spec, joined, t, st, value);
        REQUIRE(change.error.empty());

        // By definition: the session the record would be part of, among the accepted
        // records and itself, is late when last + gap + grace < stream time.
        auto with = records;
        with.push_back(accepted{seq, t, value});
        bool expect_late = false;
        for (const auto& s : sessions_by_definition(with, spec.gap_ms)) {
          auto [lo, hi] = bounds(s);
          if (t >= lo && t <= hi) {
            expect_late = hi + spec.gap_ms + spec.grace_ms < st;
            if (!expect_late) {
              CHECK(change.merged.start == lo);
              CHECK(change.merged.last == hi);
            }
          }
        }
        CHECK(change.late == expect_late);
        stream_time = st;
        if (change.late) {
          ++late;
          continue;
        }
        merges += change.removed.size();
        for (int64_t start : change.removed) REQUIRE(store.erase(start) == 1);
        store[change.merged.start] = change.merged;
        records.push_back(accepted{seq, t, value});
      }
      // Both kinds of event occurred, so the comparison covers them.
      CHECK(late > 0);
      CHECK(merges > 0);

      auto expected = sessions_by_definition(records, spec.gap_ms);
      REQUIRE(store.size() == expected.size());
      auto it = store.begin();
      for (const auto& s : expected) {
        auto [lo, hi] = bounds(s);
        std::vector<std::string> values;
        for (const auto& r : s) values.push_back(r.value);
        CHECK(it->second.start == lo);
        CHECK(it->second.last == hi);
        CHECK(nlohmann::json::parse(it->second.state) == nlohmann::json::parse(fold_all(agg, values)));
        ++it;
      }
    }
  }
}

TEST_CASE("a record bridging two sessions merges them with itself; the later one is removed") {
  aggregator agg(make(view_kind::count), 64);
  window_spec spec;
  spec.type = window_type::session;
  spec.gap_ms = 10;
  REQUIRE(normalize(spec).ok());
  const std::vector<stored_session> joined{{100, 105, "2"}, {115, 130, "3"}};
  auto change = fold_session(agg, spec, joined, 110, 130, "1");
  REQUIRE(change.error.empty());
  CHECK_FALSE(change.late);
  CHECK(change.merged.start == 100);
  CHECK(change.merged.last == 130);
  CHECK(change.merged.state == "6");
  CHECK(change.removed == std::vector<int64_t>{115});
  // The same record after stream time passed 130 + gap: the merged session closed.
  CHECK(fold_session(agg, spec, joined, 110, 141, "1").late);
  CHECK_FALSE(fold_session(agg, spec, joined, 110, 140, "1").late);
}
