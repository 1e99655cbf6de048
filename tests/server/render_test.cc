// The direct JSON writer against nlohmann: strings and bytes must be exactly what dump()
// prints; a JSON document exactly its stored bytes when it is compact, else what
// nlohmann prints for it compactly with member order kept.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <string>
#include <vector>

#include "query/key_format.h"
#include "server/json_render.h"
#include "../core/json_model.h"

using json = nlohmann::json;
using namespace kstate;
using namespace kstate::server;

namespace {

std::string dumped(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

bool valid_utf8_model(std::string_view s) {
  try {
    (void)json(std::string(s)).dump();  // dump() throws on invalid UTF-8 by default
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

// A JSON document as the API should print it: its own bytes when it is compact
// (tests/core/json_model.h) and valid UTF-8; else nlohmann's compact print in member
// order.
std::string expected_json(std::string_view doc) {
  if (kstate::testing::compact_json_model(doc) && valid_utf8_model(doc)) return std::string(doc);
  return nlohmann::ordered_json::parse(doc.begin(), doc.end(), nullptr, false)
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string expected_value(data_format f, std::string_view bytes) {
  switch (f) {
    case data_format::json: return expected_json(bytes);
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
    R"({"k":1,"a":"abc"})",   // member order kept
    R"({"a":1,"a":2})",       // a duplicate is kept
    R"({"k":1, "a":"abc"})",  // whitespace: printed again, member order kept
    R"( {"a":1} )",           // whitespace
    R"({"a": 1})",
    R"([1,2,3])",
    R"([])",
    R"({})",
    R"({"":{}})",
    R"("text")",
    R"("a\"b\\c\nd\te\rf\bg\fh")",
    R"("a\/b")",  // escapes as written
    R"("\u00e9")",
    R"("\u00E9\ud83d\ude00")",
    R"("\u00g9")",  // invalid escape
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
    R"(1.50e-07)",
    R"(123456789012345678901234567890)",  // past 64 bits: digits kept
    R"(01)",
    R"(1.)",
    R"(-)",
    "\xEF\xBB\xBF{}",
    "[1,\"\xff\"]",
    " [1,2] ",
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

TEST_CASE("json values: compact documents as stored, others printed compactly in member order") {
  for (const auto& d : json_docs) {
    CAPTURE(d);
    CHECK(rendered_value(data_format::json, d) == expected_value(data_format::json, d));
  }
}

TEST_CASE("compact documents are copied, others are refused") {
  std::string out;
  for (std::string_view doc :
       {R"({"a":"abc","k":1,"s":2})", R"({"k":1,"a":2})", R"(1.5)", R"("\u00e9")", R"([-0,0.5e+3,1E-2,"\/"])"}) {
    CAPTURE(doc);
    out.clear();
    CHECK(append_compact_json(out, doc));
    CHECK(out == doc);
  }
  out.clear();
  for (std::string_view doc : {R"({"k": 1})", "[1,2]\n", R"(01)", R"(1.)", R"(.5)", R"(+1)", R"("\x")", R"("\u12")",
                               "\"\x01\"", "\"\xc3\"", R"({"a":1,})", R"([1,])", R"({"a"})", ""}) {
    CAPTURE(doc);
    CHECK_FALSE(append_compact_json(out, doc));
  }
  CHECK(out.empty());
}

TEST_CASE("a rendered json key is the key: decoding it again gives the stored bytes") {
  for (std::string_view text :
       {R"({"b": 1, "a": [2, {"z": true, "y": null}]})", R"({"id":"x","at":1.50})", R"(["b","a"])", R"("caf\u00e9")"}) {
    CAPTURE(text);
    auto stored = query::decode_key(query::key_format::json, text, 64);
    REQUIRE(stored.ok());
    std::string rendered;
    append_rendered_key(rendered, data_format::json, *stored);
    auto again = query::decode_key(query::key_format::json, rendered, 64);
    REQUIRE(again.ok());
    CHECK(*again == *stored);
    CHECK(json::parse(rendered) == json::parse(text));
  }
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

TEST_CASE("random documents and strings render as the model says") {
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
  // Valid documents built from a DOM in random member order, printed compactly: copied.
  for (int i = 0; i < 2000; ++i) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    int members = static_cast<int>(rng() % 6);
    for (int m = 0; m < members; ++m) {
      std::string name(1, static_cast<char>('a' + rng() % 5));
      switch (rng() % 5) {
        case 0: j[name] = static_cast<int64_t>(rng()) - (1ll << 31); break;
        case 1: j[name] = std::string(rng() % 4, static_cast<char>(rng() % 128)); break;
        case 2: j[name] = nlohmann::ordered_json::array({1, "x", nullptr}); break;
        case 3: j[name] = (rng() % 2) == 0; break;
        case 4: j[name] = static_cast<double>(rng() % 1000) / 8; break;
      }
    }
    std::string doc = j.dump(-1, ' ', false, json::error_handler_t::replace);
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
