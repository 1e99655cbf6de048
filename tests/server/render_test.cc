// The direct JSON writer against nlohmann's dump(): for every input, the bytes must be
// exactly what parse + dump (the answers' previous rendering) gives.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <string>
#include <vector>

#include "query/key_format.h"
#include "server/json_render.h"

using json = nlohmann::json;
using namespace kstate;
using namespace kstate::server;

namespace {

std::string dumped(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// What the API printed before: the value parsed into a DOM and dumped again.
std::string expected_value(data_format f, std::string_view bytes) {
  switch (f) {
    case data_format::json: return dumped(json::parse(bytes.begin(), bytes.end(), nullptr, false));
    case data_format::string: return dumped(std::string(bytes));
    case data_format::bytes: return dumped(query::base64_encode(bytes));
  }
  return "";
}

std::string rendered_value(data_format f, std::string_view bytes) {
  std::string out = "prefix";
  append_rendered_value(out, f, bytes);
  REQUIRE(out.rfind("prefix", 0) == 0);
  return out.substr(6);
}

const std::vector<std::string> json_docs = {
    R"({"a":"abc","k":1,"s":2})",
    R"({"k":1,"a":"abc"})",  // unsorted: dump() sorts
    R"({"a":1,"a":2})",      // duplicate: last wins
    R"( {"a":1} )",          // whitespace
    R"({"a": 1})",
    R"([1,2,3])",
    R"([])",
    R"({})",
    R"({"":{}})",
    R"("text")",
    R"("a\"b\\c\nd\te\rf\bg\fh")",
    R"("a\/b")",    // \/ prints as /
    R"("\u00e9")",  // \u escapes print as the character
    R"("\u0001")",
    "\"caf\xc3\xa9\"",
    "\"\x7f\"",
    R"(0)",
    R"(-0)",
    R"(-1)",
    R"(123456789012345678)",
    R"(1234567890123456789)",
    R"(18446744073709551615)",
    R"(18446744073709551616)",
    R"(-9223372036854775808)",
    R"(1.5)",
    R"(1.0)",
    R"(1e2)",
    R"(1E2)",
    R"(0.1)",
    R"(true)",
    R"(false)",
    R"(null)",
    R"({"a":[true,false,null,{"b":[]}],"b":"x"})",
    R"({"b":1,"a\u0000":2})",
    R"({"a\"":1,"a":2})",
    R"({"B":1,"a":2})",
    "{\"\xc3\xa9\":1,\"z\":2}",  // non-ASCII keys order by bytes
    "{\"z\":1,\"\xc3\xa9\":2}",
    R"([[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])",
    R"({"a":1,})",  // invalid: both print the same thing
    R"(nul)",
    "",
};

}  // namespace

TEST_CASE("json values render byte-identical to parse + dump") {
  for (const auto& d : json_docs) {
    CAPTURE(d);
    CHECK(rendered_value(data_format::json, d) == expected_value(data_format::json, d));
  }
}

TEST_CASE("canonical documents are copied, others are refused") {
  std::string out;
  CHECK(append_canonical_json(out, R"({"a":"abc","k":1,"s":2})"));
  CHECK(out == R"({"a":"abc","k":1,"s":2})");
  out.clear();
  CHECK_FALSE(append_canonical_json(out, R"({"k":1,"a":2})"));
  CHECK_FALSE(append_canonical_json(out, R"(1.5)"));
  CHECK_FALSE(append_canonical_json(out, R"("\u00e9")"));
  CHECK(out.empty());
}

TEST_CASE("strings and bytes render byte-identical to dump") {
  std::vector<std::string> texts = {"",
                                    "plain",
                                    "quote\"back\\slash",
                                    std::string("nul\0byte", 8),
                                    "\x01\x1f\x7f",
                                    "caf\xc3\xa9",
                                    "bad\xff utf8",
                                    "\xed\xa0\x80",
                                    "tab\there\nnl"};
  for (const auto& t : texts) {
    CAPTURE(t);
    CHECK(rendered_value(data_format::string, t) == expected_value(data_format::string, t));
    CHECK(rendered_value(data_format::bytes, t) == expected_value(data_format::bytes, t));
    std::string k;
    append_rendered_key(k, data_format::string, t);
    CHECK(k == dumped(std::string(t)));
    k.clear();
    append_rendered_key(k, data_format::bytes, t);
    CHECK(k == dumped(query::base64url_encode(t)));
  }
}

TEST_CASE("random documents and strings render byte-identical to dump") {
  std::mt19937 rng(7);
  static const char chars[] = "{}[]\":,.-+eE0123456789 \\/ubfnrtaxyz\x01\x7f\0\xc3\xa9\xff";
  const std::string alphabet(chars, sizeof chars - 1);
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    int n = static_cast<int>(rng() % 24);
    for (int j = 0; j < n; ++j) s += alphabet[rng() % alphabet.size()];
    CAPTURE(s);
    CHECK(rendered_value(data_format::json, s) == expected_value(data_format::json, s));
    CHECK(rendered_value(data_format::string, s) == expected_value(data_format::string, s));
  }
  // Valid documents built from a DOM, printed compact and sorted, then perturbed.
  for (int i = 0; i < 2000; ++i) {
    json j = json::object();
    int members = static_cast<int>(rng() % 6);
    for (int m = 0; m < members; ++m) {
      std::string name(1, static_cast<char>('a' + rng() % 5));
      switch (rng() % 5) {
        case 0: j[name] = static_cast<int64_t>(rng()) - (1ll << 31); break;
        case 1: j[name] = std::string(rng() % 4, static_cast<char>(rng() % 128)); break;
        case 2: j[name] = json::array({1, "x", nullptr}); break;
        case 3: j[name] = (rng() % 2) == 0; break;
        case 4: j[name] = static_cast<double>(rng() % 1000) / 8; break;
      }
    }
    std::string doc = dumped(j);
    CAPTURE(doc);
    CHECK(rendered_value(data_format::json, doc) == doc);
  }
}

TEST_CASE("positions print with partitions in string order") {
  position p{{0, 5}, {2, 7}, {10, 9}, {1, 3}};
  json j = json::object();
  for (const auto& [part, off] : p) j[std::to_string(part)] = off;
  std::string out;
  append_position(out, p);
  CHECK(out == dumped(j));
  position big;
  for (int i = 0; i < 40; ++i) big.set(i * 7, i * 1000);
  json jb = json::object();
  for (const auto& [part, off] : big) jb[std::to_string(part)] = off;
  out.clear();
  append_position(out, big);
  CHECK(out == dumped(jb));
  out.clear();
  append_position(out, {});
  CHECK(out == "{}");
}
