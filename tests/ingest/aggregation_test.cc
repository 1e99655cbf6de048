// Aggregation functions and word splitting, each against an independent expectation
// written out by hand or computed by a plain model in the test.
#include <doctest/doctest.h>

#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "ingest/aggregation.h"

using namespace kstate;
using namespace kstate::ingest;
using json = nlohmann::json;

namespace {

view_def make(view_kind k) {
  view_def v;
  v.name = "v";
  v.kind = k;
  v.topic = "t";
  return v;
}

// Folds values in order; returns the final state (or the first error).
std::string fold(const aggregator& a, const std::vector<std::optional<std::string>>& values) {
  std::optional<std::string> state;
  for (const auto& val : values) {
    auto out = a.apply(state, val ? std::optional<std::string_view>(*val) : std::nullopt);
    if (!out.error.empty()) return "error: " + out.error;
    state = out.state;
  }
  return state.value_or("none");
}

}  // namespace

TEST_CASE("split_words: lower-cased runs of word characters, as written out by hand") {
  CHECK(split_words("The quick, brown FOX!") == std::vector<std::string>{"the", "quick", "brown", "fox"});
  CHECK(split_words("  don't  stop-me_now 42x ") == std::vector<std::string>{"don", "t", "stop", "me_now", "42x"});
  CHECK(split_words("").empty());
  CHECK(split_words(" ,.;:!? \t").empty());
  // Multi-byte UTF-8 letters stay inside their word; only ASCII is lower-cased.
  CHECK(split_words("Crème BRÛLÉE") == std::vector<std::string>{"crème", "brÛlÉe"});
  CHECK(split_words("a\nb\tc") == std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE("split_words agrees with a character-class model on random ASCII lines") {
  std::mt19937 rng(3);
  const std::string alphabet = "abcXYZ019_ -.,!\t";
  for (int i = 0; i < 2000; ++i) {
    std::string line;
    int n = std::uniform_int_distribution<int>(0, 30)(rng);
    for (int j = 0; j < n; ++j) line += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
    // Model: std::isalnum or '_' separate words.
    std::vector<std::string> expect;
    std::string cur;
    for (char c : line) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') cur += static_cast<char>(std::tolower(c));
      else if (!cur.empty()) { expect.push_back(cur); cur.clear(); }
    }
    if (!cur.empty()) expect.push_back(cur);
    REQUIRE_MESSAGE(split_words(line) == expect, line);
  }
}

TEST_CASE("group_keys: key, json path, words; records without a group key are refused with a reason") {
  std::vector<std::string> out;
  auto v = make(view_kind::count);
  CHECK(group_keys(v, std::string_view("k1"), std::nullopt, out).empty());
  CHECK(out == std::vector<std::string>{"k1"});
  out.clear();
  CHECK(!group_keys(v, std::nullopt, std::string_view("1"), out).empty());

  v.group_by = group_by_kind::json;
  v.group_path = "user.id";
  out.clear();
  CHECK(group_keys(v, std::nullopt, std::string_view(R"({"user":{"id":"ann"}})"), out).empty());
  CHECK(group_keys(v, std::nullopt, std::string_view(R"({"user":{"id":7}})"), out).empty());
  CHECK(out == std::vector<std::string>{"ann", "7"});
  CHECK(!group_keys(v, std::nullopt, std::string_view(R"({"user":{}})"), out).empty());
  CHECK(!group_keys(v, std::nullopt, std::string_view(R"({"user":{"id":null}})"), out).empty());
  CHECK(!group_keys(v, std::nullopt, std::string_view("not json"), out).empty());
  CHECK(!group_keys(v, std::nullopt, std::nullopt, out).empty());

  v.group_by = group_by_kind::words;
  out.clear();
  CHECK(group_keys(v, std::nullopt, std::string_view("to be, or not to BE"), out).empty());
  CHECK(out == std::vector<std::string>{"to", "be", "or", "not", "to", "be"});
  CHECK(!group_keys(v, std::nullopt, std::string_view(""), out).empty());
  CHECK(!group_keys(v, std::nullopt, std::string_view(" -- "), out).empty());
  CHECK(!group_keys(v, std::nullopt, std::string_view("\xff\xfe\x00\x01", 4), out).empty());
}

TEST_CASE("count, sum, reduce: folded values equal hand-computed results") {
  aggregator count(make(view_kind::count));
  CHECK(fold(count, {std::nullopt, "x", "1"}) == "3");

  aggregator sum(make(view_kind::sum));
  CHECK(fold(sum, {"1", "2", "39"}) == "42");
  CHECK(json::parse(fold(sum, {"1.5", "2"})).get<double>() == doctest::Approx(3.5));
  CHECK(fold(sum, {"1", "\"two\""}).rfind("error:", 0) == 0);
  CHECK(fold(sum, {"1", std::nullopt}).rfind("error:", 0) == 0);
  // Integers stay exact beyond 2^53.
  CHECK(fold(sum, {"9007199254740993", "2"}) == "9007199254740995");

  auto fv = make(view_kind::sum);
  fv.value_path = "order.amount";
  aggregator field_sum(fv);
  CHECK(fold(field_sum, {R"({"order":{"amount":5}})", R"({"order":{"amount":-2}})"}) == "3");
  CHECK(fold(field_sum, {R"({"order":{}})"}).rfind("error:", 0) == 0);
  CHECK(!field_sum.check(std::string_view(R"({"order":{"amount":"5"}})")).empty());
  CHECK(field_sum.check(std::string_view(R"({"order":{"amount":5}})")).empty());

  auto rv = make(view_kind::reduce);
  rv.reduce = reduce_op::min;
  CHECK(fold(aggregator(rv), {"5", "3", "9", "4"}) == "3");
  rv.reduce = reduce_op::max;
  CHECK(fold(aggregator(rv), {"5", "3", "9", "4"}) == "9");
  rv.reduce = reduce_op::latest;
  CHECK(fold(aggregator(rv), {"5", "3", "9", "4"}) == "4");
}

TEST_CASE("aggregate: count, sum, min, max, mean equal a model over random values") {
  auto v = make(view_kind::aggregate);
  v.fields = {agg_field::count, agg_field::sum, agg_field::min, agg_field::max, agg_field::mean};
  v.value_path = "x";
  aggregator a(v);
  std::mt19937 rng(11);
  for (int round = 0; round < 50; ++round) {
    int n = std::uniform_int_distribution<int>(1, 40)(rng);
    std::vector<std::optional<std::string>> values;
    int64_t s = 0, lo = INT64_MAX, hi = INT64_MIN;
    for (int i = 0; i < n; ++i) {
      int64_t x = std::uniform_int_distribution<int64_t>(-1000, 1000)(rng);
      values.push_back(R"({"x":)" + std::to_string(x) + "}");
      s += x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    auto got = json::parse(fold(a, values));
    CHECK(got["count"] == n);
    CHECK(got["sum"] == s);
    CHECK(got["min"] == lo);
    CHECK(got["max"] == hi);
    CHECK(got["mean"].get<double>() == doctest::Approx(static_cast<double>(s) / n));
  }
  // Only the configured fields (rendered in key order).
  v.fields = {agg_field::max, agg_field::count};
  auto got = fold(aggregator(v), {R"({"x":2})", R"({"x":7})"});
  CHECK(got == R"({"count":2,"max":7})");  // nlohmann orders object keys
}
