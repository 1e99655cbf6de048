#pragma once
// Shared by the foreign-key join integration tests: the views, a model of the join
// computed from the final tables, generated input, and reading the views back.

#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "agg_common.h"

namespace kstate::testing {

inline std::vector<kstate_process::view> fk_views(const std::string& orders, const std::string& customers) {
  const std::string common = "right: " + customers + ", foreign_key: customer.id";
  return {{"fk_inner", orders, "json", "", "string", "kind: join, join: {type: inner, " + common + "}"},
          {"fk_left", orders, "json", "", "string",
           "kind: join, join: {type: left, " + common + ", left_name: order, right_name: customer}"},
          {"fk_select", orders, "json", "", "string",
           "kind: join, cache: false, join: {type: left, " + common +
               ", select: [{side: left, field: amount}, {side: right, field: address.city, as: city}]}"}};
}

struct fk_model {
  table_model orders, customers;
};

// The customer an order names, as documented: a string id is the key, a number its
// JSON text; anything else names none.
inline std::optional<std::string> named_customer(const json& order) {
  if (!order.is_object() || !order.contains("customer") || !order["customer"].is_object()) return std::nullopt;
  const auto& c = order["customer"];
  if (!c.contains("id")) return std::nullopt;
  if (c["id"].is_string()) return c["id"].get<std::string>();
  if (c["id"].is_number()) return c["id"].dump();
  return std::nullopt;
}

inline std::map<std::string, json> expected(const fk_model& m, const std::string& view) {
  std::map<std::string, json> out;
  for (const auto& [k, text] : m.orders) {
    json order = json::parse(text), customer;
    bool found = false;
    if (auto fk = named_customer(order)) {
      auto it = m.customers.find(*fk);
      if (it != m.customers.end()) {
        customer = json::parse(it->second);
        found = true;
      }
    }
    if (view == "fk_inner" && found) out[k] = {{"left", order}, {"right", customer}};
    if (view == "fk_left") out[k] = {{"order", order}, {"customer", customer}};
    if (view == "fk_select") {
      json city;
      if (found && customer.contains("address") && customer["address"].contains("city"))
        city = customer["address"]["city"];
      out[k] = {{"amount", order.contains("amount") ? order["amount"] : json()}, {"city", city}};
    }
  }
  return out;
}

// Customer keys: "c<j>" for odd j, "<j>" for even j (named by a number in orders).
inline std::string customer_key(int j) { return j % 2 ? "c" + std::to_string(j) : std::to_string(j); }

// `records` updates of each table: orders over `order_keys` keys, each naming one of
// `customer_keys` customers (so most updates of an order change its customer), about
// one in eight a tombstone, one in twelve naming no customer (field missing, or not a
// string or number); customers with a name and usually a city.
inline void make_input(uint32_t seed, int records, int order_keys, int customer_keys, std::vector<produced>& orders,
                       std::vector<produced>& customers) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> ok(0, order_keys - 1), ck(0, customer_keys - 1), amount(1, 1000), d24(0, 23);
  for (int i = 0; i < records; ++i) {
    auto k = "o" + std::to_string(ok(rng));
    const int roll = d24(rng);
    if (roll < 3) {
      orders.push_back({k, std::nullopt});
    } else if (roll == 3) {
      orders.push_back({k, json{{"amount", amount(rng)}, {"n", i}}.dump()});
    } else if (roll == 4) {
      orders.push_back({k, json{{"amount", amount(rng)}, {"customer", {{"id", true}}}}.dump()});
    } else {
      const int j = ck(rng);
      json id = j % 2 ? json(customer_key(j)) : json(j);
      orders.push_back({k, json{{"amount", amount(rng)}, {"n", i}, {"customer", {{"id", id}}}}.dump()});
    }
    const auto c = customer_key(ck(rng));
    const int croll = d24(rng);
    if (croll < 3) customers.push_back({c, std::nullopt});
    else if (croll < 6) customers.push_back({c, json{{"name", "n" + std::to_string(i)}}.dump()});
    else
      customers.push_back(
          {c, json{{"name", "n" + std::to_string(i)}, {"address", {{"city", "city" + std::to_string(amount(rng))}}}}
                  .dump()});
  }
}

// Waits until every view of `views` read from `port` equals the model; the views that
// still differ at the deadline.
inline std::vector<std::string> wait_equal(uint16_t port, const fk_model& m, const std::vector<std::string>& views,
                                           std::chrono::seconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> wrong;
  for (;;) {
    wrong.clear();
    for (const auto& view : views)
      if (read_store(port, view) != expected(m, view)) wrong.push_back(view);
    if (wrong.empty() || std::chrono::steady_clock::now() > until) return wrong;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// Every order key ("o0".."o<order_keys - 1>") of each view of `views` looked up on `port`
// (`query` appended to each request): the model's row, or 404. Returns the wrong ones.
inline size_t check_gets(uint16_t port, const fk_model& m, const std::vector<std::string>& views, int order_keys,
                         const std::string& query = "") {
  http_client h(port);
  size_t wrong = 0;
  for (const auto& view : views) {
    auto want = expected(m, view);
    for (int i = 0; i < order_keys; ++i) {
      auto k = "o" + std::to_string(i);
      auto a = h.get("/v1/stores/" + view + "/keys/" + k + query);
      REQUIRE(a);
      auto it = want.find(k);
      bool ok = it == want.end() ? a->status == 404 : a->status == 200 && a->body_json()["value"] == it->second;
      if (!ok) {
        ++wrong;
        MESSAGE(view << "/" << k << ": " << a->status << " " << a->body
                     << "; model: " << (it == want.end() ? std::string("none") : it->second.dump()));
      }
    }
  }
  return wrong;
}

}  // namespace kstate::testing
