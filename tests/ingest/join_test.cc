// Join views' value logic (ingest/join.h) against a model: random sequences of updates
// and tombstones on both sides, every join type, with and without a projection; the
// encodings of repartition records and sides.
#include <doctest/doctest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>

#include "ingest/join.h"

using namespace kstate;
using namespace kstate::ingest;
using json = nlohmann::json;

namespace {

view_def join_view(join_type type, std::vector<join_field> select = {}) {
  view_def v;
  v.name = "j";
  v.kind = view_kind::join;
  join_spec s;
  s.type = type;
  s.right_topic = "right";
  s.left_name = "order";
  s.right_name = "customer";
  s.select = std::move(select);
  v.join = s;
  return v;
}

// The model: what the joined value of a key must be, computed from the sides as
// parsed JSON (not text), the way a reader of docs/configuration.md would.
std::optional<json> model(join_type type, const std::vector<join_field>& select, const std::optional<json>& left,
                          const std::optional<json>& right) {
  if (type == join_type::inner && (!left || !right)) return std::nullopt;
  if (type == join_type::left && !left) return std::nullopt;
  if (!left && !right) return std::nullopt;
  json out = json::object();
  if (select.empty()) {
    out["order"] = left ? *left : json();
    out["customer"] = right ? *right : json();
    return out;
  }
  for (const auto& f : select) {
    const auto& side = f.right ? right : left;
    json v;
    if (side) {
      auto p = json::json_pointer("/" + [&] {
        std::string s = f.path;
        for (auto& c : s)
          if (c == '.') c = '/';
        return s;
      }());
      if (side->contains(p)) v = side->at(p);
    }
    out[f.as] = v;
  }
  return out;
}

json random_value(std::mt19937& rng) {
  std::uniform_int_distribution<int> d(0, 9);
  json v = {{"id", d(rng)}, {"name", "n" + std::to_string(d(rng))}};
  if (d(rng) < 7) v["address"] = {{"city", "c" + std::to_string(d(rng))}};
  return v;
}

}  // namespace

TEST_CASE("repartition records carry their side; a marker alone is a tombstone") {
  const auto left = encode_join_input(join_side::left, std::string_view(R"({"a":1})"));
  auto l = decode_join_input(left);
  REQUIRE(l);
  CHECK(l->side == join_side::left);
  CHECK(l->value == std::optional<std::string_view>(R"({"a":1})"));
  const auto right = encode_join_input(join_side::right, std::nullopt);
  auto r = decode_join_input(right);
  REQUIRE(r);
  CHECK(r->side == join_side::right);
  CHECK(!r->value);
  CHECK(!decode_join_input(std::nullopt));
  CHECK(!decode_join_input(std::string_view("")));
  CHECK(!decode_join_input(std::string_view(R"({"a":1})")));
}

TEST_CASE("sides encode and decode back; empty sides are the empty string; garbage is refused") {
  for (const auto& s : {join_sides{"1", std::nullopt}, join_sides{std::nullopt, "[2]"}, join_sides{"{}", "\"x\""}}) {
    auto bytes = encode_sides(s);
    CHECK(!bytes.empty());
    CHECK(decode_sides(bytes) == std::optional<join_sides>(s));
  }
  CHECK(encode_sides(join_sides{}).empty());
  CHECK(!decode_sides(""));
  CHECK(!decode_sides("abc"));
  CHECK(!decode_sides(std::string("\x04\0\0\0\0", 5)));  // unknown flags
  CHECK(
      !decode_sides(std::string("\x01\0\0\0\x09"
                                "ab",
                                7)));  // length past the end
  CHECK(
      !decode_sides(std::string("\x01\0\0\0\x01"
                                "ab",
                                7)));  // left only, but bytes after it
}

TEST_CASE("every join type, with and without a projection, equals the model over random updates and tombstones") {
  const std::vector<std::vector<join_field>> selects = {
      {},
      {{false, "id", "order_id"}, {true, "name", "customer"}, {true, "address.city", "city"}, {false, "none.x", "x"}}};
  for (auto type : {join_type::inner, join_type::left, join_type::outer})
    for (const auto& select : selects) {
      CAPTURE(to_string(type));
      CAPTURE(select.size());
      joiner j(join_view(type, select), 64);
      std::mt19937 rng(static_cast<unsigned>(7 + static_cast<int>(type) * 10 + select.size()));
      std::map<int, join_sides> stored;  // what stage 2 keeps, encoded and decoded each time
      std::map<int, std::pair<std::optional<json>, std::optional<json>>> truth;
      size_t rows = 0;
      for (int step = 0; step < 3000; ++step) {
        int key = std::uniform_int_distribution<int>(0, 40)(rng);
        auto side = std::uniform_int_distribution<int>(0, 1)(rng) ? join_side::right : join_side::left;
        bool tombstone = std::uniform_int_distribution<int>(0, 3)(rng) == 0;
        std::optional<json> value;
        if (!tombstone) value = random_value(rng);
        // The record travels marked through the repartition topic.
        const std::string text = value ? value->dump() : std::string();
        const auto marked =
            encode_join_input(side, value ? std::optional<std::string_view>(text) : std::optional<std::string_view>());
        auto in = decode_join_input(marked);
        REQUIRE(in);
        auto decoded = decode_sides(encode_sides(stored[key])).value_or(join_sides{});
        decoded.of(in->side) = in->value ? std::optional<std::string>(std::string(*in->value)) : std::nullopt;
        stored[key] = decoded;
        (side == join_side::left ? truth[key].first : truth[key].second) = value;

        auto got = j.joined(stored[key]);
        auto want = model(type, select, truth[key].first, truth[key].second);
        REQUIRE(got.has_value() == want.has_value());
        if (got) {
          ++rows;
          auto parsed = json::parse(*got);
          REQUIRE(parsed == *want);
        }
        if (!tombstone) continue;
        // A key whose sides are both gone is deleted (no sides left to store).
        if (stored[key].empty()) CHECK(encode_sides(stored[key]).empty());
      }
      CHECK(rows > 0);
    }
}

TEST_CASE("a projection lists its fields in the configured order") {
  joiner j(join_view(join_type::outer, {{true, "b", "zeta"}, {false, "a", "alpha"}}), 64);
  auto out = j.joined(join_sides{R"({"a":1})", R"({"b":2})"});
  REQUIRE(out);
  CHECK(*out == R"({"zeta":2,"alpha":1})");
  // The other side missing: its fields are null.
  CHECK(*j.joined(join_sides{R"({"a":1})", std::nullopt}) == R"({"zeta":null,"alpha":1})");
}

TEST_CASE("names are JSON-escaped in the joined value") {
  auto v = join_view(join_type::left);
  v.join->left_name = "a\"b";
  joiner j(v, 64);
  auto out = j.joined(join_sides{"1", std::nullopt});
  REQUIRE(out);
  CHECK(json::parse(*out) == json{{"a\"b", 1}, {"customer", nullptr}});
}
