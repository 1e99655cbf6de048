// check_json: validity exactly as nlohmann's accept() decides, and the depth bound at
// its boundary, for arrays and objects.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_check.h"
#include "json_model.h"

using namespace kstate;

namespace {

// nlohmann::json::accept is the reference: it is what parses records and keys later.
// Its parser is iterative, so it answers for any depth.
bool reference(std::string_view s) { return nlohmann::json::accept(s.begin(), s.end()); }

bool valid(std::string_view s) { return check_json(s, max_max_json_depth) == json_verdict::ok; }

std::string arrays(int depth, const std::string& inner = "") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

std::string objects(int depth, const std::string& inner = "1") {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "{\"k\":";
  return s + inner + std::string(depth, '}');
}

// Fixed cases at the edges of the grammar, of numbers' range, of UTF-8 and of depth,
// then 50,000 random strings of JSON's bytes and tokens.
std::vector<std::string> inputs() {
  std::vector<std::string> cases = {
      "",
      " ",
      "{}",
      "[]",
      " {\"a\" : [1, 2.5, -0, 1e3, 1E-3, true, false, null] } ",
      "{\"a\":1,}",
      "[1,]",
      "[,1]",
      "{\"a\"}",
      "{\"a\":}",
      "{1:2}",
      "\"\\u00e9\\ud83d\\ude00\"",
      "\"\\ud83d\"",
      "\"\\ude00\"",
      "\"\\ud83dx\"",
      "\"\\u12G4\"",
      "\"\\/\\b\\f\\n\\r\\t\\\"\\\\\"",
      "\"\\a\"",
      "\"tab\there\"",
      "01",
      "-",
      "-01",
      "1.",
      ".5",
      "+1",
      "1e",
      "1e+",
      "1e400",
      "-1e400",
      "1e-400",
      "123456789012345678901234567890",
      std::string(400, '9'),
      "18446744073709551615",
      "18446744073709551616",
      "-9223372036854775809",
      "tru",
      "nulll",
      "truex",
      "\xEF\xBB\xBF{}",
      "\xEF\xBB{}",
      "\xEF{}",
      "{}\xEF\xBB\xBF",
      std::string("{}\0xyz", 6),
      std::string("\0", 1),
      std::string("[\0]", 3),
      "\"caf\xc3\xa9\"",
      "\"\xc3\"",
      "\"\xed\xa0\x80\"",
      "\"\xf4\x90\x80\x80\"",
      "\"\x7f\"",
      arrays(75),
      "[[]",
      "[]]",
      "{\"a\":{\"b\":[{}]}}",
      "\r\n\t1\r\n\t",
      "1 2",
      "\"a\" \"b\"",
      arrays(5000),
      objects(5000),
      arrays(5000).substr(1),
      objects(5000) + "}",
      // Without an exponent, finite up to 308 digits before the point.
      std::string(308, '9') + ".5",
      std::string(309, '9') + ".5",
      "-" + std::string(308, '9') + ".25",
      "-" + std::string(309, '9') + ".25",
      "0." + std::string(400, '1'),
      "305.44193664749343",
      "[1.5,{\"a\":-0.25e2},\"x y\"]",
      "[1.5, 2]",
      "{\"a\":1}\n",
      "\t{}",
      "1.7976931348623157e308",
      "1.7976931348623159e308",
      "0." + std::string(70, '0') + "1e-300",
  };
  std::mt19937 rng(11);
  static const char chars[] = "{}[]\":,.-+eE0123456789 \t\\/ubfnrtaxyzl\x01\x7f\0\xc3\xa9\xff\xed";
  const std::string alphabet(chars, sizeof chars - 1);
  const std::vector<std::string> pieces = {"{",    "}",    "[", "]",  ",",  ":", "\"k\"", "\"\\u00e9\"", "1", "-2.5e3",
                                           "true", "null", " ", "\"", "\\", "0", "e",     "\xEF\xBB\xBF"};
  for (int i = 0; i < 50000; ++i) {
    std::string s;
    int n = static_cast<int>(rng() % 16);
    for (int j = 0; j < n; ++j) {
      if (rng() % 2) s += alphabet[rng() % alphabet.size()];
      else s += pieces[rng() % pieces.size()];
    }
    cases.push_back(std::move(s));
  }
  return cases;
}

}  // namespace

TEST_CASE("check_json accepts exactly what nlohmann's accept() accepts") {
  for (const auto& c : inputs()) {
    CAPTURE(c.substr(0, 200));
    CHECK(valid(c) == reference(c));
  }
}

TEST_CASE("check_json with json_layout::compact: accept() without whitespace outside strings, BOM or NUL") {
  for (const auto& c : inputs()) {
    CAPTURE(c.substr(0, 200));
    CHECK((check_json(c, max_max_json_depth, json_layout::compact) == json_verdict::ok) ==
          testing::compact_json_model(c));
  }
}

TEST_CASE("check_json: a document exactly at the depth limit is ok, one level deeper is too_deep") {
  for (int limit : {1, 2, 3, 128, 10'000}) {
    CAPTURE(limit);
    CHECK(check_json(arrays(limit), limit) == json_verdict::ok);
    CHECK(check_json(arrays(limit + 1), limit) == json_verdict::too_deep);
    CHECK(check_json(objects(limit), limit) == json_verdict::ok);
    CHECK(check_json(objects(limit + 1), limit) == json_verdict::too_deep);
    // Mixed containers, the deepest one empty: depth counts empty containers too.
    CHECK(check_json(objects(limit - 1, "[]"), limit) == json_verdict::ok);
    CHECK(check_json(objects(limit, "{}"), limit) == json_verdict::too_deep);
    CHECK(check_json(arrays(limit - 1, "{\"a\":[1,2]}"), limit) == json_verdict::too_deep);
    CHECK(check_json(arrays(limit - 1, "{\"a\":1}"), limit) == json_verdict::ok);
  }
  // Depth is nesting, not the number of containers: siblings do not add up.
  CHECK(check_json("[[1],[2],{\"a\":3},[]]", 2) == json_verdict::ok);
  CHECK(check_json("[[1],[2],{\"a\":[3]},[]]", 2) == json_verdict::too_deep);
  CHECK(check_json("{\"a\":[1],\"b\":{\"c\":2}}", 2) == json_verdict::ok);
  CHECK(check_json("{\"a\":[1],\"b\":{\"c\":[]}}", 2) == json_verdict::too_deep);
  // Scalars are 0 deep.
  for (const char* scalar : {"1", "\"[[[[\"", "null", "true"}) CHECK(check_json(scalar, 1) == json_verdict::ok);
  // too_deep is decided when the container opens, whatever follows.
  CHECK(check_json("[[[[ not json", 3) == json_verdict::too_deep);
  CHECK(check_json("[[ not json", 3) == json_verdict::invalid);
  CHECK(check_json("[1,", 3) == json_verdict::invalid);
}

TEST_CASE("check_json refuses a document nested 100,000 deep without recursing") {
  CHECK(check_json(arrays(100'000), default_max_json_depth) == json_verdict::too_deep);
  CHECK(check_json(objects(100'000), default_max_json_depth) == json_verdict::too_deep);
  // Above the configurable maximum the check itself still runs in constant stack.
  CHECK(check_json(arrays(100'000), 1'000'000) == json_verdict::ok);
  CHECK(check_json(arrays(100'000) + "]", 1'000'000) == json_verdict::invalid);
}
