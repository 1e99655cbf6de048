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
  CHECK(split_words("a\nb\tc") == std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE("split_words: Unicode letters, digits, marks and connectors make words; lower-cased fully") {
  using words = std::vector<std::string>;
  // Punctuation and spaces outside ASCII separate words.
  CHECK(split_words("42\u201442") == words{"42", "42"});                               // em dash
  CHECK(split_words("\u201cHello\u201d, she said") == words{"hello", "she", "said"});  // curly quotes
  CHECK(split_words("it\u2019s") == words{"it", "s"});                                 // curly apostrophe
  CHECK(split_words("100\u00a0km") == words{"100", "km"});                             // no-break space
  CHECK(split_words("10\u202f000") == words{"10", "000"});                             // narrow no-break space
  CHECK(split_words("a\u3000b\u2003c") == words{"a", "b", "c"});                       // ideographic, em space
  CHECK(split_words("\u00bfqu\u00e9?\u00a1ya!") == words{"qu\u00e9", "ya"});
  CHECK(split_words("smile\U0001F600face") == words{"smile", "face"});  // emoji: a symbol
  // Letters of every script, with their combining marks, lower-cased.
  CHECK(split_words("Cr\u00e8me BR\u00dbL\u00c9E") == words{"cr\u00e8me", "br\u00fbl\u00e9e"});
  CHECK(split_words("Cafe\u0301 NOE\u0308L") == words{"cafe\u0301", "noe\u0308l"});  // combining acute, diaeresis
  CHECK(split_words("\u0915\u093f\u0924\u093e\u092c") ==
        words{"\u0915\u093f\u0924\u093e\u092c"});  // Devanagari with vowel signs
  CHECK(split_words("\u6771\u4eac\u30bf\u30ef\u30fc\u3001\u5927\u962a") ==
        words{"\u6771\u4eac\u30bf\u30ef\u30fc", "\u5927\u962a"});  // CJK: runs, split at the ideographic comma
  CHECK(split_words("snake_case\u203fjoined") == words{"snake_case\u203fjoined"});  // connector punctuation
  // Digits and numbers of other scripts are kept as written.
  CHECK(split_words("\u0664\u0662 \u0967\u0968\u0969 x\u00b2") ==
        words{"\u0664\u0662", "\u0967\u0968\u0969", "x\u00b2"});
  // Full lower-case mapping, root locale.
  CHECK(split_words("STRASSE Stra\u00dfe \u1e9e") == words{"strasse", "stra\u00dfe", "\u00df"});
  CHECK(split_words("\u039f\u0394\u039f\u03a3 \u03a3\u0391\u03a3") ==
        words{"\u03bf\u03b4\u03bf\u03c2", "\u03c3\u03b1\u03c2"});  // final sigma at the end of a word only
  CHECK(split_words("\u0130stanbul ISPARTA \u0131spanak") ==
        words{"i\u0307stanbul", "isparta", "\u0131spanak"});  // dotted capital I: i + combining dot
  CHECK(split_words("\u2166") == words{"\u2176"});            // ROMAN NUMERAL SEVEN: a number with a lower case
  // Ill-formed bytes separate words (group_keys refuses such values before).
  CHECK(split_words(std::string("ab\xff"
                                "cd\xc3",
                                6)) == words{"ab", "cd"});
}

TEST_CASE("group_keys and aggregators refuse JSON deeper than max_json_depth instead of crashing") {
  const std::string deep_group = "{\"user\":{\"id\":" + std::string(100'000, '[') + std::string(100'000, ']') + "}}";
  auto v = make(view_kind::count);
  v.group_by = group_by_kind::json;
  v.group_path = "user.id";
  std::vector<std::string> out;
  CHECK(group_keys(v, std::nullopt, std::string_view(deep_group), 128, out) ==
        "value is nested deeper than max_json_depth (128)");
  CHECK(out.empty());
  // At the limit the field is a key, printed compactly.
  const std::string at_limit = "{\"user\":{\"id\":" + std::string(126, '[') + std::string(126, ']') + "}}";
  CHECK(group_keys(v, std::nullopt, std::string_view(at_limit), 128, out).empty());
  CHECK(out == std::vector<std::string>{std::string(126, '[') + std::string(126, ']')});
  CHECK(group_keys(v, std::nullopt, std::string_view(at_limit), 127, out) ==
        "value is nested deeper than max_json_depth (127)");

  // A group key that is a string holding deep JSON, for a view that renders keys as JSON.
  v.key_format = data_format::json;
  const std::string deep_text = "{\"user\":{\"id\":\"" + std::string(200, '[') + std::string(200, ']') + "\"}}";
  CHECK(group_keys(v, std::nullopt, std::string_view(deep_text), 128, out) ==
        "group key is nested deeper than max_json_depth (128)");
  auto by_key = make(view_kind::count);
  by_key.key_format = data_format::json;
  CHECK(group_keys(by_key, std::string_view(std::string(129, '[') + std::string(129, ']')), std::string_view("1"), 128,
                   out) == "group key is nested deeper than max_json_depth (128)");
  by_key.key_format = data_format::string;
  CHECK(group_keys(by_key, std::string_view(std::string(129, '[') + std::string(129, ']')), std::string_view("1"), 128,
                   out)
            .empty());

  // sum reads the number from the value; the depth is checked before the parse.
  auto sv = make(view_kind::sum);
  sv.value_path = "a";
  aggregator sum(sv, 4);
  CHECK(sum.check(std::string_view(R"({"a":1,"b":[[[]]]})")).empty());
  CHECK(sum.check(std::string_view(R"({"a":1,"b":[[[[]]]]})")) == "value is nested deeper than max_json_depth (4)");
  CHECK(sum.apply(std::nullopt, std::string_view(R"({"a":1,"b":[[[[]]]]})")).error ==
        "value is nested deeper than max_json_depth (4)");

  // The event time of a windowed view from a field of a deep value.
  auto wv = make(view_kind::count);
  wv.window = window_spec{};
  wv.window->size_ms = 60'000;
  wv.window->time_field = "t";
  int64_t ts = 0;
  CHECK(event_time(wv, std::string_view(deep_group), -1, 128, ts) ==
        "value is nested deeper than max_json_depth (128)");
  CHECK(event_time(wv, std::string_view(R"({"t":1796205600000})"), -1, 128, ts).empty());
  CHECK(ts == 1'796'205'600'000);
}

TEST_CASE("check_future: record timestamps and time fields beyond window.max_future are refused with a reason") {
  auto v = make(view_kind::count);
  v.window = window_spec{};
  v.window->size_ms = 60'000;
  REQUIRE(normalize(*v.window).ok());
  const int64_t now = 1'796'292'000'000;  // 2026-12-03T10:00:00Z
  const int64_t year_9999 = 253'402'214'400'000;
  int64_t ts = 0;
  // From the record timestamp.
  REQUIRE(event_time(v, std::nullopt, year_9999, 128, ts).empty());
  CHECK(check_future(v, ts, now) ==
        "event time 9999-12-31T00:00:00.000Z is more than max_future (86400000 ms) ahead of the clock "
        "(2026-12-03T10:00:00.000Z)");
  REQUIRE(event_time(v, std::nullopt, now + 86'400'000, 128, ts).empty());
  CHECK(check_future(v, ts, now).empty());
  // From a time field, as epoch ms or ISO-8601.
  v.window->time_field = "t";
  REQUIRE(event_time(v, std::string_view(R"({"t":"9999-12-31T00:00:00Z"})"), now, 128, ts).empty());
  CHECK_FALSE(check_future(v, ts, now).empty());
  REQUIRE(event_time(v, std::string_view(R"({"t":9223372036854775807})"), now, 128, ts).empty());
  CHECK(check_future(v, ts, now).rfind("event time 9223372036854775807 ms is more than max_future", 0) == 0);
  REQUIRE(event_time(v, std::string_view(R"({"t":"2026-12-03T10:00:00Z"})"), now, 128, ts).empty());
  CHECK(check_future(v, ts, now).empty());
  // A view without a window has no event time to refuse.
  CHECK(check_future(make(view_kind::count), year_9999, now).empty());
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
      else if (!cur.empty()) {
        expect.push_back(cur);
        cur.clear();
      }
    }
    if (!cur.empty()) expect.push_back(cur);
    REQUIRE_MESSAGE(split_words(line) == expect, line);
  }
}

TEST_CASE("group_keys: key, json path, words; records without a group key are refused with a reason") {
  std::vector<std::string> out;
  auto v = make(view_kind::count);
  CHECK(group_keys(v, std::string_view("k1"), std::string_view("1"), 128, out).empty());
  CHECK(out == std::vector<std::string>{"k1"});
  out.clear();
  // A tombstone is nothing to count (Kafka Streams' count() skips it too).
  CHECK(group_keys(v, std::string_view("k1"), std::nullopt, 128, out) == "null value: nothing to aggregate");
  CHECK(out.empty());
  CHECK(!group_keys(v, std::nullopt, std::string_view("1"), 128, out).empty());

  v.group_by = group_by_kind::json;
  v.group_path = "user.id";
  out.clear();
  CHECK(group_keys(v, std::nullopt, std::string_view(R"({"user":{"id":"ann"}})"), 128, out).empty());
  CHECK(group_keys(v, std::nullopt, std::string_view(R"({"user":{"id":7}})"), 128, out).empty());
  CHECK(out == std::vector<std::string>{"ann", "7"});
  CHECK(!group_keys(v, std::nullopt, std::string_view(R"({"user":{}})"), 128, out).empty());
  CHECK(!group_keys(v, std::nullopt, std::string_view(R"({"user":{"id":null}})"), 128, out).empty());
  CHECK(!group_keys(v, std::nullopt, std::string_view("not json"), 128, out).empty());
  CHECK(!group_keys(v, std::nullopt, std::nullopt, 128, out).empty());

  v.group_by = group_by_kind::words;
  out.clear();
  CHECK(group_keys(v, std::nullopt, std::string_view("to be, or not to BE"), 128, out).empty());
  CHECK(out == std::vector<std::string>{"to", "be", "or", "not", "to", "be"});
  CHECK(!group_keys(v, std::nullopt, std::string_view(""), 128, out).empty());
  CHECK(!group_keys(v, std::nullopt, std::string_view(" -- "), 128, out).empty());
  CHECK(!group_keys(v, std::nullopt, std::string_view("\xff\xfe\x00\x01", 4), 128, out).empty());
}

TEST_CASE("count, sum, reduce: folded values equal hand-computed results") {
  aggregator count(make(view_kind::count), 128);
  CHECK(fold(count, {std::nullopt, "x", "1"}) == "3");

  aggregator sum(make(view_kind::sum), 128);
  CHECK(fold(sum, {"1", "2", "39"}) == "42");
  CHECK(json::parse(fold(sum, {"1.5", "2"})).get<double>() == doctest::Approx(3.5));
  CHECK(fold(sum, {"1", "\"two\""}).rfind("error:", 0) == 0);
  CHECK(fold(sum, {"1", std::nullopt}).rfind("error:", 0) == 0);
  // Integers stay exact beyond 2^53.
  CHECK(fold(sum, {"9007199254740993", "2"}) == "9007199254740995");

  auto fv = make(view_kind::sum);
  fv.value_path = "order.amount";
  aggregator field_sum(fv, 128);
  CHECK(fold(field_sum, {R"({"order":{"amount":5}})", R"({"order":{"amount":-2}})"}) == "3");
  CHECK(fold(field_sum, {R"({"order":{}})"}).rfind("error:", 0) == 0);
  CHECK(!field_sum.check(std::string_view(R"({"order":{"amount":"5"}})")).empty());
  CHECK(field_sum.check(std::string_view(R"({"order":{"amount":5}})")).empty());

  auto rv = make(view_kind::reduce);
  rv.reduce = reduce_op::min;
  CHECK(fold(aggregator(rv, 128), {"5", "3", "9", "4"}) == "3");
  rv.reduce = reduce_op::max;
  CHECK(fold(aggregator(rv, 128), {"5", "3", "9", "4"}) == "9");
  rv.reduce = reduce_op::latest;
  CHECK(fold(aggregator(rv, 128), {"5", "3", "9", "4"}) == "4");
}

TEST_CASE("aggregate: count, sum, min, max, mean equal a model over random values") {
  auto v = make(view_kind::aggregate);
  v.fields = {agg_field::count, agg_field::sum, agg_field::min, agg_field::max, agg_field::mean};
  v.value_path = "x";
  aggregator a(v, 128);
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
  auto got = fold(aggregator(v, 128), {R"({"x":2})", R"({"x":7})"});
  CHECK(got == R"({"count":2,"max":7})");  // nlohmann orders object keys
}

namespace {

// Splits `values` at random points into runs, combines each run into one partial, and
// folds the partials in order: the result a re-keyed view reaches through its
// repartition topic when stage 1 combines each batch's records.
std::string fold_combined(const aggregator& a, const std::vector<std::optional<std::string>>& values,
                          std::mt19937& rng) {
  std::optional<std::string> state;
  size_t at = 0;
  while (at < values.size()) {
    size_t run = std::uniform_int_distribution<size_t>(1, values.size() - at)(rng);
    partial_aggregate p;
    for (size_t i = at; i < at + run; ++i) {
      auto why = a.combine(p, values[i] ? std::optional<std::string_view>(*values[i]) : std::nullopt, 100 + i);
      if (!why.empty()) return "error: " + why;
    }
    CHECK(p.count == static_cast<int64_t>(run));
    CHECK(p.timestamp == static_cast<int64_t>(100 + at + run - 1));
    const std::string encoded = a.encode(p);
    CHECK(is_partial(std::string_view(encoded)));
    auto out = a.apply(state, std::string_view(encoded));
    if (!out.error.empty()) return "error: " + out.error;
    state = out.state;
    at += run;
  }
  return state.value_or("none");
}

}  // namespace

TEST_CASE("combined records fold to exactly what the records one by one fold to, for every kind") {
  std::mt19937 rng(17);
  std::vector<view_def> views;
  views.push_back(make(view_kind::count));
  views.push_back(make(view_kind::sum));
  for (auto op : {reduce_op::latest, reduce_op::min, reduce_op::max}) {
    auto v = make(view_kind::reduce);
    v.reduce = op;
    views.push_back(v);
  }
  auto agg = make(view_kind::aggregate);
  agg.fields = {agg_field::count, agg_field::sum, agg_field::min, agg_field::max, agg_field::mean};
  views.push_back(agg);
  agg.fields = {agg_field::mean, agg_field::count, agg_field::sum};
  views.push_back(agg);
  for (const auto& v : views) {
    aggregator a(v, 128);
    for (int round = 0; round < 40; ++round) {
      std::vector<std::optional<std::string>> values;
      int n = std::uniform_int_distribution<int>(1, 30)(rng);
      for (int i = 0; i < n; ++i) {
        // Integers, some beyond 2^53 (exact), and now and then a fraction.
        if (std::uniform_int_distribution<int>(0, 9)(rng) == 0)
          values.push_back(std::to_string(std::uniform_int_distribution<int>(-500, 500)(rng)) + ".25");
        else
          values.push_back(
              std::to_string(std::uniform_int_distribution<int64_t>(-(int64_t{1} << 60), int64_t{1} << 60)(rng)));
      }
      CAPTURE(to_string(v.kind));
      CAPTURE(round);
      const auto one_by_one = fold(a, values);
      REQUIRE(one_by_one.rfind("error:", 0) != 0);
      const auto combined = fold_combined(a, values, rng);
      // Sums of integers are exact either way; a fraction makes both doubles, added in
      // another order, so those compare within rounding.
      auto x = json::parse(one_by_one), y = json::parse(combined);
      if (x.is_object()) {
        for (auto it = x.begin(); it != x.end(); ++it) {
          if (it->is_number_float() || y[it.key()].is_number_float())
            CHECK(y[it.key()].get<double>() == doctest::Approx(it->get<double>()).epsilon(1e-9));
          else CHECK(y[it.key()] == *it);
        }
        CHECK(x.size() == y.size());
      } else if (x.is_number_float() || y.is_number_float()) {
        CHECK(y.get<double>() == doctest::Approx(x.get<double>()).epsilon(1e-9));
      } else {
        CHECK(combined == one_by_one);
      }
    }
  }
}

TEST_CASE("a combined record that is not what stage 1 writes is refused, not folded") {
  auto v = make(view_kind::sum);
  aggregator a(v, 128);
  const std::string marker(1, partial_marker);
  for (const std::string& bad : {marker, marker + "[]", marker + R"({"sum":3})", marker + R"({"count":0,"sum":3})",
                                 marker + R"({"count":2})", marker + R"({"count":2,"sum":"3"})",
                                 marker + R"({"count":2,"sum":3,"min":1,"max":2,"latest":)" + std::string(200, '[')}) {
    CAPTURE(bad);
    CHECK_FALSE(a.apply(std::string_view("5"), std::string_view(bad)).error.empty());
  }
  // A count needs no numbers: a count alone is a partial of a count view.
  aggregator count(make(view_kind::count), 128);
  auto out = count.apply(std::string_view("5"), std::string_view(marker + R"({"count":3})"));
  CHECK(out.error.empty());
  CHECK(out.state == "8");
  // Words carry no value; a record from a kstate that did not combine folds as one.
  CHECK(count.apply(std::string_view("5"), std::nullopt).state == "6");
}
