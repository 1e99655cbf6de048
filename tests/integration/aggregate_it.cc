// Aggregate views against the real broker: the seed's word count over a generated
// corpus equals an independent recount; bad input is counted, dead-lettered, and
// ingest goes on.
#include <doctest/doctest.h>

#include <fstream>
#include <set>

#include "agg_common.h"

using namespace kstate::testing;

TEST_CASE("word count over 200,000 generated lines equals the recount, word by word") {
  auto c = make_corpus(200'000, 2'000, 42);
  auto topic = unique_name("lines");
  create_topic(topic, 6);
  produce(topic, c.records);

  auto dir = temp_dir("wordcount");
  kstate_process ks(unique_name("wc-app"), {{"words", topic, "json", "", "string", "kind: count, group_by: words"}},
                    dir + "/state");
  ks.start();
  ks.wait_ready();
  auto started = std::chrono::steady_clock::now();
  auto total = wait_total(ks.port(), "words", c.words, std::chrono::seconds(240));
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  MESSAGE(c.records.size() << " lines, " << c.words << " words, " << c.counts.size() << " distinct; counted in ~"
                           << secs << " s after ready");
  CHECK(total == c.words);

  // Every word of the recount, one point lookup each, exactly.
  http_client h(ks.port());
  size_t wrong = 0;
  for (const auto& [word, n] : c.counts) {
    auto a = h.get("/v1/stores/words/keys/" + pct(word));
    REQUIRE(a);
    REQUIRE_MESSAGE(a->status == 200, word << ": " << a->body);
    if (a->body_json()["value"] != n) {
      ++wrong;
      MESSAGE(word << ": got " << a->body_json()["value"] << ", recount " << n);
    }
  }
  CHECK(wrong == 0);
  // And no word the corpus does not have.
  auto all = read_store(ks.port(), "words");
  CHECK(all.size() == c.counts.size());

  // The store says what it is, and every update went to the changelog.
  auto info = h.get("/v1/stores/words");
  REQUIRE(info);
  auto body = info->body_json();
  CHECK(body["kind"] == "count");
  CHECK(body["source"] == topic);
  CHECK(body["group_by"] == "words");
  CHECK(ks.metric_sum("kstate_ingest_records_invalid_total") == 0);
  CHECK(ks.terminate() == 0);
}

TEST_CASE(
    "bad input: not-a-number for sum, empty or binary lines, missing group field: counted, dead-lettered, ingest goes "
    "on") {
  auto lines = unique_name("badlines"), amounts = unique_name("amounts"), orders = unique_name("orders");
  auto dlq = unique_name("agg-dlq");
  create_topic(lines, 3);
  create_topic(amounts, 3);
  create_topic(orders, 3);
  create_topic(dlq, 1);

  // Lines: good ones, empty ones, punctuation only, and invalid UTF-8 bytes.
  std::vector<produced> line_recs;
  std::map<std::string, int64_t> words;
  int bad_lines = 0;
  for (int i = 0; i < 3000; ++i) {
    if (i % 50 == 7) {
      line_recs.push_back({std::nullopt, std::string("")});
      ++bad_lines;
    } else if (i % 50 == 19) {
      line_recs.push_back({std::nullopt, std::string("\xff\xfe\x80 binary \xc3", 12)});
      ++bad_lines;
    } else if (i % 50 == 31) {
      line_recs.push_back({std::nullopt, std::string(" -- !! ")});
      ++bad_lines;
    } else {
      auto w = "w" + std::to_string(i % 37);
      line_recs.push_back({std::nullopt, "x " + w});
      ++words["x"];
      ++words[w];
    }
  }
  // Sums by key: numbers, and some values that are not numbers.
  std::vector<produced> amount_recs;
  std::map<std::string, int64_t> sums;
  int bad_amounts = 0;
  for (int i = 0; i < 2000; ++i) {
    auto k = "acct-" + std::to_string(i % 23);
    if (i % 40 == 3) {
      amount_recs.push_back({k, std::string("\"twelve\"")});
      ++bad_amounts;
    } else if (i % 40 == 11) {
      amount_recs.push_back({k, std::string("{not json")});
      ++bad_amounts;
    } else {
      amount_recs.push_back({k, std::to_string(i % 100 - 30)});
      sums[k] += i % 100 - 30;
    }
  }
  // Orders grouped by a JSON field; some lack it.
  std::vector<produced> order_recs;
  std::map<std::string, int64_t> per_user;
  int bad_orders = 0;
  for (int i = 0; i < 1000; ++i) {
    if (i % 25 == 5) {
      order_recs.push_back({std::nullopt, R"({"amount":1})"});
      ++bad_orders;
    } else {
      auto u = "u" + std::to_string(i % 9);
      order_recs.push_back({std::nullopt, R"({"user":{"id":")" + u + R"("},"amount":)" + std::to_string(i % 7) + "}"});
      per_user[u] += i % 7;
    }
  }
  produce_bytes(lines, line_recs);
  produce(amounts, amount_recs);
  produce(orders, order_recs);

  auto dir = temp_dir("aggbad");
  kstate_process ks(unique_name("aggbad-app"),
                    {{"words", lines, "json", dlq, "string", "kind: count, group_by: words"},
                     {"sums", amounts, "json", dlq, "string", "kind: sum"},
                     {"spend", orders, "json", dlq, "string", "kind: sum, group_by: {json: user.id}, value: amount"}},
                    dir + "/state");
  ks.start();
  ks.wait_ready();
  int64_t word_total = 0;
  for (const auto& [w, n] : words) word_total += n;
  CHECK(wait_total(ks.port(), "words", word_total, std::chrono::seconds(120)) == word_total);
  int64_t spend_total = 0;
  for (const auto& [u, n] : per_user) spend_total += n;
  CHECK(wait_total(ks.port(), "spend", spend_total, std::chrono::seconds(60)) == spend_total);

  http_client h(ks.port());
  for (const auto& [w, n] : words) {
    auto a = h.get("/v1/stores/words/keys/" + w);
    REQUIRE(a);
    REQUIRE(a->status == 200);
    CHECK_MESSAGE(a->body_json()["value"] == n, w);
  }
  auto all_sums = read_store(ks.port(), "sums");
  REQUIRE(all_sums.size() == sums.size());
  for (const auto& [k, n] : sums) CHECK_MESSAGE(all_sums[k] == n, k);
  auto all_spend = read_store(ks.port(), "spend");
  for (const auto& [u, n] : per_user) CHECK_MESSAGE(all_spend[u] == n, u);
  CHECK(all_spend.size() == per_user.size());

  int injected = bad_lines + bad_amounts + bad_orders;
  CHECK(ks.metric_sum("kstate_ingest_records_invalid_total") == injected);
  CHECK(metric_with(ks.port(), "kstate_ingest_records_invalid_total", "store=\"words\"") == bad_lines);
  CHECK(metric_with(ks.port(), "kstate_ingest_records_invalid_total", "store=\"sums\"") == bad_amounts);
  CHECK(metric_with(ks.port(), "kstate_ingest_records_invalid_total", "store=\"spend\"") == bad_orders);
  CHECK(ks.metric_sum("kstate_ingest_records_dead_lettered_total") == injected);

  // The dead-letter topic holds each once, with the source coordinates.
  std::map<std::string, int> by_view;
  std::set<std::tuple<std::string, int, int64_t>> seen;
  for (const auto& r : consume_all(dlq, injected)) {
    ++by_view[r.headers.at("kstate.view")];
    CHECK_FALSE(r.headers.at("kstate.reason").empty());
    seen.insert({r.headers.at("kstate.topic"), std::stoi(r.headers.at("kstate.partition")),
                 std::stoll(r.headers.at("kstate.offset"))});
  }
  CHECK(by_view["words"] == bad_lines);
  CHECK(by_view["sums"] == bad_amounts);
  CHECK(by_view["spend"] == bad_orders);
  CHECK(seen.size() == static_cast<size_t>(injected));

  std::ifstream log(ks.log_path());
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  CHECK(text.find("in view sums: value is not a number") != std::string::npos);
  CHECK(text.find("in view words: value is not valid UTF-8") != std::string::npos);
  CHECK(text.find("in view spend: value has no field 'user.id'") != std::string::npos);
  CHECK(ks.terminate() == 0);
}
