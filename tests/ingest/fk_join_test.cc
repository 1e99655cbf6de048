// Foreign-key join views' value logic (ingest/fk_join.h): the foreign key of a left
// value, the encodings of internal records and rows, and the whole protocol between the
// left and right sides simulated with random delivery order across partitions, compared
// with a model recomputed from the final tables.
#include <doctest/doctest.h>

#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>

#include "core/json_check.h"
#include "ingest/fk_join.h"
#include "ingest/join.h"

using namespace kstate;
using namespace kstate::ingest;
using json = nlohmann::json;

namespace {

view_def fk_view(join_type type) {
  view_def v;
  v.name = "fk";
  v.kind = view_kind::join;
  join_spec s;
  s.type = type;
  s.right_topic = "customers";
  s.left_name = "order";
  s.right_name = "customer";
  v.join = s;
  return v;
}

std::optional<std::string> fk_of(const std::string& value) {
  return foreign_key_of(value, "customer.id", data_format::string, default_max_json_depth);
}

// The model of one left key's joined value, from the final tables as parsed JSON.
std::optional<json> model(join_type type, const std::optional<std::string>& left,
                          const std::map<std::string, std::string>& right) {
  if (!left) return std::nullopt;
  json l = json::parse(*left);
  json r;
  const json* id = l.contains("customer") && l["customer"].is_object() && l["customer"].contains("id")
                       ? &l["customer"]["id"]
                       : nullptr;
  if (id && (id->is_string() || id->is_number())) {
    auto it = right.find(id->is_string() ? id->get<std::string>() : id->dump());
    if (it != right.end()) r = json::parse(it->second);
  }
  if (type == join_type::inner && r.is_null()) return std::nullopt;
  return json{{"order", l}, {"customer", r}};
}

}  // namespace

TEST_CASE("a foreign key is a string field's text or a number's JSON text; anything else refers to nothing") {
  std::string why;
  CHECK(foreign_key_of(R"({"c":{"id":"a\u00e9"}})", "c.id", data_format::string, 8) == std::string("a\xc3\xa9"));
  CHECK(foreign_key_of(R"({"c":{"id":"ab"}})", "c.id", data_format::json, 8) == std::string("\"ab\""));
  CHECK(foreign_key_of(R"({"c":{"id":42}})", "c.id", data_format::string, 8) == std::string("42"));
  CHECK(foreign_key_of(R"({"c":{"id":-1.5}})", "c.id", data_format::string, 8) == std::string("-1.5"));
  for (const char* v : {R"({"c":{"id":null}})", R"({"c":{"id":true}})", R"({"c":{"id":[1]}})", R"({"c":{"id":{}}})",
                        R"({"c":{}})", R"({"c":3})", R"([1])", R"("x")", "not json"}) {
    why.clear();
    CHECK_MESSAGE(!foreign_key_of(v, "c.id", data_format::string, 8, &why), v);
    CHECK_MESSAGE(!why.empty(), v);
  }
  // Nested deeper than the bound: refers to nothing, never parsed.
  CHECK(!foreign_key_of(R"({"c":{"id":[[[[1]]]]}})", "c.id", data_format::string, 3, &why));
}

TEST_CASE("internal records, rows and subscriptions decode to what was encoded; anything else is refused") {
  std::mt19937 rng(7);
  auto text = [&](size_t max) {
    std::string s(rng() % (max + 1), '\0');
    for (auto& c : s) c = static_cast<char>(rng() % 256);
    return s;
  };
  for (int i = 0; i < 2000; ++i) {
    fk_message m;
    m.kind = static_cast<fk_message_kind>(rng() % 4);
    if (m.kind == fk_message_kind::subscribe) m.left_partition = static_cast<int32_t>(rng() % 100000);
    if (m.kind != fk_message_kind::right) m.version = static_cast<int64_t>(rng() % 1'000'000'000'000ULL);
    if (m.kind == fk_message_kind::subscribe || m.kind == fk_message_kind::unsubscribe) m.left_key = text(20);
    if ((m.kind == fk_message_kind::right || m.kind == fk_message_kind::response) && rng() % 3) m.value = text(30);
    // A right record's empty value is a tombstone: the marker alone.
    if (m.kind == fk_message_kind::right && m.value && m.value->empty()) m.value.reset();
    CHECK(decode_fk_message(encode_fk_message(m)) == m);

    fk_left_row r;
    r.left = text(30);
    if (rng() % 2) {
      r.fk = text(10);
      r.version = static_cast<int64_t>(rng() % 1000);
      r.answered = rng() % 2;
      if (r.answered && rng() % 2) r.right = text(30);
    }
    CHECK(decode_fk_left_row(encode_fk_left_row(r)) == r);
    fk_subscription s{static_cast<int32_t>(rng() % 1000), static_cast<int64_t>(rng() % 100000)};
    CHECK(decode_fk_subscription(encode_fk_subscription(s)) == s);
    // Arbitrary bytes never crash a decoder.
    auto junk = text(40);
    (void)decode_fk_message(junk);
    (void)decode_fk_left_row(junk);
    (void)decode_fk_subscription(junk);
  }
  CHECK(encode_fk_left_row(fk_left_row{}).empty());
  CHECK(!decode_fk_message(""));
  CHECK(!decode_fk_message(std::string(1, fk_subscribe_marker) + "abc"));
  CHECK(!decode_fk_message(std::string(1, fk_response_marker) + std::string(8, '\0') + "\x02"));
  CHECK(!decode_fk_message(std::string(1, join_left_marker) + "{}"));
  // One foreign key's subscriptions never share a prefix with a longer one's.
  CHECK(fk_subscription_prefix("a").compare(0, 6, fk_subscription_prefix("ab")) != 0);
}

TEST_CASE("a late answer for an old foreign key never overwrites the answer of the new one") {
  const joiner j(fk_view(join_type::left), default_max_json_depth);
  fk_left_row row;
  auto s1 = fk_apply_left(row, "o1", 0, R"({"customer":{"id":"a"}})", std::string("a"), 10);
  REQUIRE(s1.send.size() == 1);
  CHECK(s1.send[0].key == "a");
  CHECK(s1.send[0].message.kind == fk_message_kind::subscribe);
  // Waiting for the first answer: no row yet, not a null match.
  CHECK(!j.joined(fk_sides(s1.row)));
  auto s2 = fk_apply_left(s1.row, "o1", 0, R"({"customer":{"id":"b"}})", std::string("b"), 11);
  REQUIRE(s2.send.size() == 2);
  CHECK(s2.send[0].key == "a");
  CHECK(s2.send[0].message.kind == fk_message_kind::unsubscribe);
  CHECK(s2.send[1].key == "b");
  row = s2.row;
  CHECK(fk_apply_response(row, 11, R"({"n":"B"})"));
  CHECK(!fk_apply_response(row, 10, R"({"n":"A"})"));
  CHECK(json::parse(*j.joined(fk_sides(row))) ==
        json::parse(R"({"order":{"customer":{"id":"b"}},"customer":{"n":"B"}})"));
  // A change of another field keeps the answer: joined at once, no round trip.
  auto s3 = fk_apply_left(row, "o1", 0, R"({"customer":{"id":"b"},"x":1})", std::string("b"), 12);
  CHECK(s3.send.empty());
  CHECK(json::parse(*j.joined(fk_sides(s3.row))) ==
        json::parse(R"({"order":{"customer":{"id":"b"},"x":1},"customer":{"n":"B"}})"));
  // An unsubscription sent for version 11 leaves a newer subscription of the same key.
  fk_message unsub{fk_message_kind::unsubscribe, "o1", 0, 11, std::nullopt};
  CHECK(!fk_unsubscribe_removes(fk_subscription{0, 12}, unsub));
  CHECK(fk_unsubscribe_removes(fk_subscription{0, 10}, unsub));
  // A tombstone unsubscribes and deletes the row.
  auto s4 = fk_apply_left(s3.row, "o1", 0, std::nullopt, std::nullopt, 13);
  CHECK(s4.row.empty());
  REQUIRE(s4.send.size() == 1);
  CHECK(s4.send[0].message.kind == fk_message_kind::unsubscribe);
}

namespace {

// The protocol on P left partitions and Q right partitions, with a queue per partition
// of each internal topic (Kafka keeps a partition's order, not the order across them).
struct simulation {
  static constexpr int P = 3;
  static constexpr int Q = 2;
  join_type type;
  joiner j;
  std::mt19937 rng;
  // The inputs' final tables, the model's input.
  std::map<std::string, std::string> left_table, right_table;
  // Repartition topic partitions (left copies and answers) and subscription topic ones.
  struct rp_record {
    std::string key;
    std::string value;
    int64_t offset;
  };
  std::deque<rp_record> rp[P];
  int64_t rp_end[P] = {};
  std::deque<std::pair<std::string, std::string>> sq[Q];
  // Left side: rows; right side: right values and subscriptions per partition.
  std::map<std::string, fk_left_row> rows;
  std::map<std::string, std::optional<std::string>> served;
  std::map<std::string, std::string> right_side[Q];
  std::map<std::pair<std::string, std::string>, fk_subscription> subs[Q];
  // Every value each foreign key had, by step, to check that an applied answer is one
  // the right table held at or after the subscription it answers.
  int64_t step = 0;
  std::map<std::string, std::vector<std::pair<int64_t, std::optional<std::string>>>> history;
  std::map<std::pair<std::string, int64_t>, int64_t> subscribed_at;
  uint64_t stale = 0;
  // At least once with crashes: a side's state rolls back to its last commit (state and
  // position move together) and the records it read since are read again, while what it
  // sent stays sent. Off: every record is read once, as under exactly once.
  bool crashes = false;
  uint64_t crashed = 0;
  struct left_commit {
    std::map<std::string, fk_left_row> rows;
    std::map<std::string, std::optional<std::string>> served;
    std::vector<rp_record> since;
  } left_commits[P];
  struct right_commit {
    std::map<std::string, std::string> values;
    std::map<std::pair<std::string, std::string>, fk_subscription> subs;
    std::vector<std::pair<std::string, std::string>> since;
  } right_commits[Q];

  simulation(join_type t, unsigned seed) : type(t), j(fk_view(t), default_max_json_depth), rng(seed) {}

  template <typename M>
  static M of_partition(const M& all, int p) {
    M out;
    for (const auto& [k, v] : all)
      if (left_partition(k) == p) out.emplace(k, v);
    return out;
  }
  void commit_left(int p) { left_commits[p] = {of_partition(rows, p), of_partition(served, p), {}}; }
  void crash_left(int p) {
    for (auto it = rows.begin(); it != rows.end();)
      it = left_partition(it->first) == p ? rows.erase(it) : std::next(it);
    for (auto it = served.begin(); it != served.end();)
      it = left_partition(it->first) == p ? served.erase(it) : std::next(it);
    auto& c = left_commits[p];
    rows.insert(c.rows.begin(), c.rows.end());
    served.insert(c.served.begin(), c.served.end());
    rp[p].insert(rp[p].begin(), c.since.begin(), c.since.end());
    c.since.clear();
    ++crashed;
  }
  void commit_right(int q) { right_commits[q] = {right_side[q], subs[q], {}}; }
  void crash_right(int q) {
    auto& c = right_commits[q];
    right_side[q] = c.values;
    subs[q] = c.subs;
    sq[q].insert(sq[q].begin(), c.since.begin(), c.since.end());
    c.since.clear();
    ++crashed;
  }

  static int left_partition(const std::string& k) { return static_cast<int>(k.back() % P); }
  static int right_partition(const std::string& fk) { return static_cast<int>(fk.size() % Q); }

  void produce_rp(int p, std::string key, std::string value) {
    rp[p].push_back({std::move(key), std::move(value), rp_end[p]++});
  }

  void write_left(const std::string& k, std::optional<std::string> v) {
    if (v) left_table[k] = *v;
    else left_table.erase(k);
    produce_rp(left_partition(k), k, encode_join_input(join_side::left, v));
  }
  void write_right(const std::string& fk, std::optional<std::string> v) {
    if (v) right_table[fk] = *v;
    else right_table.erase(fk);
    history[fk].emplace_back(step, v);
    fk_message m;
    m.value = v;
    sq[right_partition(fk)].emplace_back(fk, encode_fk_message(m));
  }

  void deliver_rp(int p) {
    auto r = rp[p].front();
    rp[p].pop_front();
    left_commits[p].since.push_back(r);
    auto& row = rows[r.key];
    if (auto in = decode_join_input(r.value)) {
      std::optional<std::string> fk;
      if (in->value) fk = fk_of(std::string(*in->value));
      auto s = fk_apply_left(row, r.key, p, in->value, fk, r.offset);
      row = std::move(s.row);
      for (auto& out : s.send) {
        if (out.message.kind == fk_message_kind::subscribe)
          subscribed_at.try_emplace({r.key, out.message.version}, step);
        sq[right_partition(out.key)].emplace_back(out.key, encode_fk_message(out.message));
      }
    } else {
      auto m = decode_fk_message(r.value);
      REQUIRE(m);
      REQUIRE(m->kind == fk_message_kind::response);
      if (fk_apply_response(row, m->version, m->value)) {
        // Never an answer older than the subscription it answers.
        const int64_t since = subscribed_at.at({r.key, m->version});
        const auto& h = history[*row.fk];
        std::set<std::optional<std::string>> possible;
        std::optional<std::string> at_start;
        for (const auto& [t, v] : h) {
          if (t <= since) at_start = v;
          else possible.insert(v);
        }
        possible.insert(at_start);
        CHECK(possible.count(m->value) == 1);
      } else {
        ++stale;
      }
    }
    served[r.key] = j.joined(fk_sides(row));
    if (row.empty()) rows.erase(r.key);
  }

  void deliver_sq(int q) {
    auto [key, bytes] = sq[q].front();
    sq[q].pop_front();
    right_commits[q].since.emplace_back(key, bytes);
    auto m = decode_fk_message(bytes);
    REQUIRE(m);
    auto answer = [&](const fk_response& a) { produce_rp(a.left_partition, a.left_key, encode_fk_message(a.message)); };
    switch (m->kind) {
      case fk_message_kind::right: {
        if (m->value) right_side[q][key] = *m->value;
        else right_side[q].erase(key);
        for (auto it = subs[q].lower_bound({key, ""}); it != subs[q].end() && it->first.first == key; ++it)
          answer(fk_answer(it->first.second, it->second, m->value));
        break;
      }
      case fk_message_kind::subscribe: {
        auto& slot = subs[q];
        auto it = slot.find({key, m->left_key});
        std::optional<fk_subscription> existing;
        if (it != slot.end()) existing = it->second;
        if (auto s = fk_apply_subscribe(existing, *m)) {
          slot[{key, m->left_key}] = *s;
          auto r = right_side[q].find(key);
          answer(fk_answer(m->left_key, *s,
                           r == right_side[q].end() ? std::nullopt : std::optional<std::string>(r->second)));
        }
        break;
      }
      case fk_message_kind::unsubscribe: {
        auto it = subs[q].find({key, m->left_key});
        std::optional<fk_subscription> existing;
        if (it != subs[q].end()) existing = it->second;
        if (fk_unsubscribe_removes(existing, *m)) subs[q].erase(it);
        break;
      }
      case fk_message_kind::response: FAIL("a response in the subscription topic");
    }
  }

  bool deliver_one() {
    std::vector<int> ready;
    for (int p = 0; p < P; ++p)
      if (!rp[p].empty()) ready.push_back(p);
    for (int q = 0; q < Q; ++q)
      if (!sq[q].empty()) ready.push_back(P + q);
    if (ready.empty()) return false;
    int pick = ready[rng() % ready.size()];
    if (pick < P) deliver_rp(pick);
    else deliver_sq(pick - P);
    return true;
  }

  std::string random_left() {
    switch (rng() % 8) {
      case 0: return R"({"customer":{}})";
      case 1: return R"({"customer":{"id":true},"n":)" + std::to_string(rng() % 100) + "}";
      case 2:
        return R"({"customer":{"id":)" + std::to_string(rng() % 3) + R"(},"n":)" + std::to_string(rng() % 100) + "}";
      default:
        return R"({"customer":{"id":"c)" + std::string(1 + rng() % 3, static_cast<char>('a' + rng() % 3)) +
               R"("},"n":)" + std::to_string(rng() % 100) + "}";
    }
  }
  std::string random_fk() {
    if (rng() % 4 == 0) return std::to_string(rng() % 3);
    return "c" + std::string(1 + rng() % 3, static_cast<char>('a' + rng() % 3));
  }

  void run(int steps) {
    for (; step < steps; ++step) {
      const auto roll = rng() % 10;
      if (roll < 3) {
        const std::string k = "o" + std::to_string(rng() % 12);
        write_left(k, rng() % 6 == 0 ? std::nullopt : std::optional<std::string>(random_left()));
      } else if (roll < 5) {
        const auto fk = random_fk();
        write_right(fk, rng() % 5 == 0 ? std::nullopt
                                       : std::optional<std::string>(R"({"v":)" + std::to_string(rng() % 1000) + "}"));
      } else if (crashes && roll == 5) {
        const int side = static_cast<int>(rng() % (P + Q));
        const bool crash = rng() % 3 == 0;
        if (side < P) crash ? crash_left(side) : commit_left(side);
        else crash ? crash_right(side - P) : commit_right(side - P);
      } else {
        deliver_one();
      }
    }
    while (deliver_one()) ++step;
  }
};

}  // namespace

namespace {

void check_random_runs(bool crashes) {
  for (auto type : {join_type::inner, join_type::left}) {
    uint64_t stale = 0;
    uint64_t crashed = 0;
    for (unsigned seed = 1; seed <= 40; ++seed) {
      CAPTURE(seed);
      CAPTURE(to_string(type));
      simulation sim(type, seed);
      sim.crashes = crashes;
      sim.run(3000);
      stale += sim.stale;
      crashed += sim.crashed;
      std::set<std::string> keys;
      for (const auto& [k, v] : sim.served) keys.insert(k);
      for (const auto& [k, v] : sim.left_table) keys.insert(k);
      for (const auto& k : keys) {
        CAPTURE(k);
        auto lt = sim.left_table.find(k);
        auto expected = model(type, lt == sim.left_table.end() ? std::nullopt : std::optional<std::string>(lt->second),
                              sim.right_table);
        auto it = sim.served.find(k);
        std::optional<json> got;
        if (it != sim.served.end() && it->second) got = json::parse(*it->second);
        CHECK(got == expected);
      }
      // The right side keeps no subscription of a left key that left its foreign key.
      for (int q = 0; q < simulation::Q; ++q)
        for (const auto& [fk_k, s] : sim.subs[q]) {
          auto row = sim.rows.find(fk_k.second);
          REQUIRE(row != sim.rows.end());
          CHECK(row->second.fk == fk_k.first);
          CHECK(row->second.version == s.version);
        }
    }
    // The runs did exercise late answers for foreign keys the rows had left (and crashes).
    CHECK(stale > 0);
    CHECK((crashed > 0) == crashes);
  }
}

}  // namespace

TEST_CASE("random updates of both tables, foreign-key changes and tombstones end in the model's join") {
  check_random_runs(/*crashes=*/false);
}

TEST_CASE(
    "at least once: sides that crash and read their input again since their last commit end in the model's join") {
  check_random_runs(/*crashes=*/true);
}
