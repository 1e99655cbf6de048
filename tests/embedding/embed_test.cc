// The public embedding API without a broker and without HTTP: defining views in code is
// checked by the configuration's own rules, a node that is not running answers
// unavailable, listeners refuse what they cannot serve. Linked to kstate::kstate only,
// so a public header that needs an internal one fails to compile here.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>

#include "kstate/kstate.h"

using namespace kstate::embed;

namespace {

node_options valid() {
  node_options o;
  o.application_id = "embed-unit";
  o.bootstrap_servers = "127.0.0.1:1";
  o.state_dir = "/tmp/kstate-embed-unit-never-opened";
  view_options orders;
  orders.name = "orders";
  orders.topic = "orders";
  view_options by_customer;
  by_customer.name = "by_customer";
  by_customer.kind = view_kind::count;
  by_customer.topic = "orders";
  by_customer.group_by = "json:customer";
  o.views = {orders, by_customer};
  return o;
}

// The message of the error create() gives for `o`, which must fail invalid_argument.
std::string refusal(const node_options& o) {
  auto n = node::create(o);
  REQUIRE_FALSE(n.ok());
  CHECK(n.err().code == error_code::invalid_argument);
  return n.err().message;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("the library reports the version of the header it was built from") {
  CHECK(std::string(version()) == KSTATE_VERSION_STRING);
  CHECK(std::string(KSTATE_VERSION_STRING) == std::to_string(KSTATE_VERSION_MAJOR) + "." +
                                                  std::to_string(KSTATE_VERSION_MINOR) + "." +
                                                  std::to_string(KSTATE_VERSION_PATCH));
}

TEST_CASE("valid options make a node that is not running yet") {
  auto n = node::create(valid());
  REQUIRE(n.ok());
  CHECK_FALSE((*n)->ready());
  CHECK((*n)->http_port() == 0);
  auto got = (*n)->get("orders", "k");
  REQUIRE_FALSE(got.ok());
  CHECK(got.err().code == error_code::unavailable);
  CHECK((*n)->count("orders").err().code == error_code::unavailable);
  CHECK((*n)->range("orders", {}).err().code == error_code::unavailable);
  CHECK((*n)->get_many("orders", {"a", "b"}).err().code == error_code::unavailable);
  CHECK((*n)->current_position("orders").err().code == error_code::unavailable);
  (*n)->stop();  // never started: nothing to do
  (*n)->stop();
}

TEST_CASE("view options are checked by the configuration's rules, naming the key at fault") {
  SUBCASE("required keys") {
    auto o = valid();
    o.views[0].topic.clear();
    CHECK(contains(refusal(o), "views[0].topic: is required"));
    o = valid();
    o.application_id.clear();
    CHECK(contains(refusal(o), "application_id"));
    o = valid();
    o.views.clear();
    CHECK(contains(refusal(o), "views: is required"));
  }
  SUBCASE("names") {
    auto o = valid();
    o.views[1].name = "orders";
    CHECK(contains(refusal(o), "views[1].name: duplicate view name 'orders'"));
    o.views[1].name = "bad name/with slash";
    CHECK(contains(refusal(o), "views[1].name: must match"));
  }
  SUBCASE("aggregate-only keys on a table") {
    auto o = valid();
    o.views[0].group_by = "words";
    CHECK(contains(refusal(o), "views[0].group_by: applies to aggregate views only"));
  }
  SUBCASE("group_by") {
    auto o = valid();
    o.views[1].group_by = "json:.customer";
    CHECK(contains(refusal(o), "views[1].group_by.json: must be a dotted path"));
    o.views[1].group_by = "colour";
    CHECK(contains(refusal(o), "views[1].group_by: must be key, words or {json: <path>}"));
    o.views[1].kind = view_kind::sum;
    o.views[1].group_by = "words";
    CHECK(contains(refusal(o), "words can only be counted"));
  }
  SUBCASE("formats") {
    auto o = valid();
    o.views[1].value_format = data_format::bytes;
    CHECK(contains(refusal(o), "views[1].value_format: an aggregate's values are JSON"));
  }
  SUBCASE("windows") {
    auto o = valid();
    o.views[1].window = window_options{};
    CHECK(contains(refusal(o), "views[1].window.size: is required"));
    o.views[1].window->size = "1 fortnight";
    CHECK(contains(refusal(o), "views[1].window.size"));
    o.views[1].window->size = "1m";
    o.views[1].window->type = "hopping";
    CHECK(contains(refusal(o), "views[1].window.advance: is required for hopping windows"));
    o.views[1].window->advance = "10s";
    CHECK(node::create(o).ok());
    o.views[1].window = window_options{.type = "session"};
    CHECK(contains(refusal(o), "views[1].window.inactivity_gap: is required for session windows"));
    o.views[1].window->inactivity_gap = "30m";
    CHECK(node::create(o).ok());
  }
  SUBCASE("join") {
    auto o = valid();
    view_options j;
    j.name = "orders_customers";
    j.kind = view_kind::join;
    j.topic = "orders";
    o.views.push_back(j);
    CHECK(contains(refusal(o), "views[2].join: is required for kind join"));
    o.views[2].join = join_options{.type = "left"};
    CHECK(contains(refusal(o), "views[2].join.right: is required: the topic of the right table"));
    o.views[2].join->right = "customers";
    o.views[2].join->type = "cross";
    CHECK(contains(refusal(o), "views[2].join.type: must be one of: inner, left, outer (got 'cross')"));
    o.views[2].join->type = "left";
    o.views[2].join->select = {{.side = "", .field = "amount", .as = "amount"}};
    CHECK(contains(refusal(o), "views[2].join.select[0].side: is required: left or right"));
    o.views[2].join->select = {{.side = "left", .field = "amount", .as = "amount"},
                               {.side = "right", .field = "name", .as = "customer"}};
    CHECK(node::create(o).ok());
    o.views[2].join->foreign_key = "customer..id";
    CHECK(contains(refusal(o), "views[2].join.foreign_key: must be a dotted path"));
    o.views[2].join->foreign_key = "customer.id";
    o.views[2].join->type = "outer";
    CHECK(contains(refusal(o), "views[2].join.type: a foreign-key join is inner or left"));
    o.views[2].join->type = "left";
    CHECK(node::create(o).ok());
  }
  SUBCASE("reduce and fields") {
    auto o = valid();
    o.views[1].kind = view_kind::reduce;
    CHECK(contains(refusal(o), "views[1].reduce: is required for kind reduce"));
    o.views[1].reduce = "median";
    CHECK(contains(refusal(o), "views[1].reduce: must be one of: latest, min, max"));
    o.views[1].kind = view_kind::aggregate;
    o.views[1].reduce.clear();
    o.views[1].fields = {"mean"};
    CHECK(contains(refusal(o), "mean needs count and sum"));
  }
  SUBCASE("kafka properties kstate owns") {
    auto o = valid();
    o.kafka["enable.auto.commit"] = "true";
    CHECK(contains(refusal(o), "kafka.enable.auto.commit: is set by kstate"));
    o = valid();
    o.kafka["no.such.property"] = "1";
    CHECK(contains(refusal(o), "no.such.property"));
  }
  SUBCASE("values that look like other YAML types stay strings") {
    auto o = valid();
    o.views[0].topic = "true";
    o.views[1].topic = "123: {x}";
    o.state_dir = "- a: [b]";
    auto n = node::create(o);
    CHECK_MESSAGE(n.ok(), (n.ok() ? "" : n.err().message));
  }
}

TEST_CASE("settings reach any configuration key, checked as in the file") {
  auto o = valid();
  o.settings = {{"query.max_limit", "50"}, {"query.default_limit", "20"}};
  CHECK(node::create(o).ok());
  o.settings = {{"query.max_limit", "0"}};
  CHECK(contains(refusal(o), "query.max_limit: must be between 1 and"));
  o.settings = {{"no_such.key", "1"}};
  CHECK(contains(refusal(o), "no_such.key: unknown key (from node_options.settings)"));
  o.settings = {{"query.default_limit", "500"}, {"query.max_limit", "100"}};
  CHECK(contains(refusal(o), "query.default_limit"));
  o = valid();
  o.listen = "no-port";
  CHECK(contains(refusal(o), "http.listen: must be host:port"));
}

TEST_CASE("listeners: unknown stores, empty callbacks and cancellation") {
  auto n = node::create(valid());
  REQUIRE(n.ok());
  auto bad = (*n)->listen("nope", [](const change&) {});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.err().code == error_code::not_found);
  auto empty = (*n)->listen("orders", nullptr);
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.err().code == error_code::invalid_argument);
  auto zero = (*n)->listen(
      "orders", [](const change&) {}, listen_options{0});
  CHECK(zero.err().code == error_code::invalid_argument);
  auto s = (*n)->listen("orders", [](const change&) {});
  REQUIRE(s.ok());
  CHECK(s->delivered() == 0);
  s->cancel();
  s->cancel();
  subscription moved = std::move(*s);
  moved.cancel();
}

TEST_CASE("error codes have names") {
  CHECK(std::string(to_string(error_code::not_here)) == "not_here");
  CHECK(std::string(to_string(error_code::deadline_exceeded)) == "deadline_exceeded");
}
