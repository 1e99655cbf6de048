// Bearer tokens and per-store scopes on every kind of route, against two instances of
// one application: no token, an unknown token, a token for another store, a token with
// the store's prefix, a metrics-only token and an admin token each get exactly the
// status the table below says. Forwarding never widens access: the forwarding instance
// refuses before forwarding, the owner refuses a forwarded request without the scope,
// and an allowed range gathered from both instances equals the model.
#include <doctest/doctest.h>

#include <fstream>
#include <set>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {

struct token {
  std::string name;
  std::string secret;  // empty: no Authorization header
};

std::vector<std::pair<std::string, std::string>> auth_headers(const token& t) {
  if (t.secret.empty()) return {};
  return {{"Authorization", "Bearer " + t.secret}};
}

std::string hash_with_kstate(const std::string& secret) {
  auto out = sh("printf '%s\\n' '" + secret + "' | " KSTATE_BINARY " token hash");
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::optional<http_answer> request(uint16_t port, const std::string& method, const std::string& target, const token& t,
                                   const std::string& body = {},
                                   std::vector<std::pair<std::string, std::string>> extra = {}) {
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (const auto& [k, v] : auth_headers(t)) req += k + ": " + v + "\r\n";
  for (const auto& [k, v] : extra) req += k + ": " + v + "\r\n";
  if (method == "POST")
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  http_client c(port);
  return c.raw(req + "\r\n" + body);
}

}  // namespace

TEST_CASE("token scopes decide every route's status, also through a forwarding instance") {
  const int partitions = 4;
  auto orders_topic = unique_name("auth-orders");
  auto users_topic = unique_name("auth-users");
  create_topic(orders_topic, partitions);
  create_topic(users_topic, 1);
  std::vector<produced> recs;
  table_model model;
  for (int i = 0; i < 400; ++i) {
    produced r{"k-" + std::to_string(i), R"({"n":)" + std::to_string(i) + "}"};
    recs.push_back(r);
    apply_record(model, r);
  }
  produce(orders_topic, recs);
  produce(users_topic, {{"u-1", R"({"name":"ann"})"}});

  // Tokens are random per run; the file holds only their hashes, made by
  // `kstate token hash` and checked against coreutils' sha256sum.
  const auto run = unique_name("t");
  const token none{"none", ""}, bad{"bad", "not-a-known-token-" + run}, users{"users", "users-" + run},
      orders{"orders", "orders-" + run}, metrics{"metrics", "metrics-" + run}, admin{"admin", "admin-" + run};
  auto dir = temp_dir("auth");
  auto token_file = dir + "/tokens.yaml";
  {
    std::ofstream f(token_file);
    f << "tokens:\n";
    auto entry = [&](const token& t, const std::string& scopes) {
      auto h = hash_with_kstate(t.secret);
      auto ref = sh("printf '%s' '" + t.secret + "' | sha256sum");
      CHECK(h == ref.substr(0, 64));
      f << "  - {name: " << t.name << ", sha256: " << h << (scopes.empty() ? "" : ", ") << scopes << "}\n";
    };
    entry(users, "stores: [users]");
    entry(orders, "stores: [\"orders*\"]");
    entry(metrics, "metrics: true");
    entry(admin, "stores: [\"*\"], cluster: true, metrics: true");
  }

  auto app = unique_name("auth-app");
  // "orders-win": a windowed count over the same topic, covered by the orders token.
  const std::vector<kstate_process::view> views{
      {"orders-eu", orders_topic},
      {"users", users_topic},
      {"orders-win", orders_topic, "json", "", "string", "kind: count, window: {type: tumbling, size: 1h}"}};
  const std::string extra = "auth: {token_file: " + token_file + "}\n";
  kstate_process a(app, views, dir + "/a", extra);
  kstate_process b(app, views, dir + "/b", extra);
  a.extra_args({"--log-level", "debug"});
  b.extra_args({"--log-level", "debug"});
  a.start();
  b.start();
  a.wait_ready();
  b.wait_ready();
  const std::string admin_auth = "Bearer " + admin.secret;
  // Settled as both instances see it, each holding what the group gave it (between
  // the two rounds of a rebalance the group is Stable while moved partitions have no
  // holder yet).
  bool settled = false;
  std::string why;
  for (int i = 0; i < 600 && !settled; ++i) {
    settled = cluster_settled(a.port(), 2, partitions + 1, admin_auth) &&
              cluster_settled(b.port(), 2, partitions + 1, admin_auth) &&
              group_settled({a.port(), b.port()}, partitions + 1, &why, admin_auth);
    if (!settled) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE_MESSAGE(settled, "the group did not settle (" << why << "); see " << a.log_path());

  // The specified status of each route kind for each token. Store routes name the
  // store "orders-eu": the users token is for another store, the orders token covers
  // it by prefix.
  struct route_case {
    std::string kind, method, target, body;
    // none, bad, users, orders, metrics, admin
    std::array<int, 6> status;
  };
  const std::array<token, 6> tokens{none, bad, users, orders, metrics, admin};
  const std::vector<route_case> cases = {
      {"health", "GET", "/livez", "", {200, 200, 200, 200, 200, 200}},
      {"readiness", "GET", "/readyz", "", {200, 200, 200, 200, 200, 200}},
      {"api description", "GET", "/openapi.json", "", {200, 200, 200, 200, 200, 200}},
      {"metrics", "GET", "/metrics", "", {401, 401, 403, 403, 200, 200}},
      {"cluster", "GET", "/v1/cluster", "", {401, 401, 403, 403, 403, 200}},
      {"store list", "GET", "/v1/stores", "", {401, 401, 200, 200, 200, 200}},
      {"store", "GET", "/v1/stores/orders-eu", "", {401, 401, 403, 200, 403, 200}},
      {"key", "GET", "/v1/stores/orders-eu/keys/k-7", "", {401, 401, 403, 200, 403, 200}},
      {"missing key", "GET", "/v1/stores/orders-eu/keys/nope", "", {401, 401, 403, 404, 403, 404}},
      {"key metadata", "GET", "/v1/stores/orders-eu/keys/k-7/metadata", "", {401, 401, 403, 200, 403, 200}},
      {"range", "GET", "/v1/stores/orders-eu/keys?limit=50", "", {401, 401, 403, 200, 403, 200}},
      {"prefix scan", "GET", "/v1/stores/orders-eu/keys?prefix=k-1", "", {401, 401, 403, 200, 403, 200}},
      {"count", "GET", "/v1/stores/orders-eu/count", "", {401, 401, 403, 200, 403, 200}},
      {"batchGet",
       "POST",
       "/v1/stores/orders-eu/keys:batchGet",
       R"({"keys":["k-1","k-2","k-399"]})",
       {401, 401, 403, 200, 403, 200}},
      {"key windows", "GET", "/v1/stores/orders-win/windows/k-7?from=0", "", {401, 401, 403, 200, 403, 200}},
      {"window range", "GET", "/v1/stores/orders-win/windows?limit=50", "", {401, 401, 403, 200, 403, 200}},
      {"other store's key", "GET", "/v1/stores/users/keys/u-1", "", {401, 401, 200, 403, 403, 200}},
      // A store nobody configured: a scoped token cannot tell it from a forbidden one.
      {"unknown store", "GET", "/v1/stores/orders-x/keys/k", "", {401, 401, 403, 404, 403, 404}},
  };
  for (auto* via : {&a, &b}) {
    for (const auto& rc : cases) {
      for (size_t t = 0; t < tokens.size(); ++t) {
        auto r = request(via->port(), rc.method, rc.target, tokens[t], rc.body);
        REQUIRE(r);
        CHECK_MESSAGE(r->status == rc.status[t], rc.kind << " with token '" << tokens[t].name << "' via " << via->port()
                                                         << ": " << r->status << " " << r->body);
        if (r->status == 401) {
          CHECK(r->headers["www-authenticate"].rfind("Bearer", 0) == 0);
          CHECK(r->headers["content-type"] == "application/problem+json");
          CHECK(r->body_json()["error_code"] == 40101);
        }
        if (r->status == 403) {
          CHECK(r->headers["content-type"] == "application/problem+json");
          CHECK(r->body_json()["error_code"] == 40301);
        }
      }
    }
  }

  // The store list shows only what the token may read.
  auto names = [&](const token& t) {
    std::set<std::string> out;
    auto r = request(a.port(), "GET", "/v1/stores", t);
    REQUIRE(r);
    const auto body = r->body_json();  // kept: iterating a temporary's member would dangle
    for (const auto& s : body["data"]) out.insert(s["name"].get<std::string>());
    return out;
  };
  CHECK(names(users) == std::set<std::string>{"users"});
  CHECK(names(orders) == std::set<std::string>{"orders-eu", "orders-win"});
  CHECK(names(metrics).empty());
  CHECK(names(admin) == std::set<std::string>{"orders-eu", "orders-win", "users"});

  // Who owns what: each instance owns some of the orders partitions.
  auto cluster = request(a.port(), "GET", "/v1/cluster", admin)->body_json();
  std::map<int, std::string> owner;
  for (const auto& p : cluster["partitions"])
    if (p["topic"] == orders_topic) owner[p["partition"].get<int>()] = p["owner"].get<std::string>();
  REQUIRE(owner.size() == static_cast<size_t>(partitions));
  const std::string eb = "http://127.0.0.1:" + std::to_string(b.port());
  std::vector<int> b_parts;
  for (const auto& [p, o] : owner)
    if (o == eb) b_parts.push_back(p);
  MESSAGE("instance b owns " << b_parts.size() << " of " << partitions << " orders partitions");

  // An allowed range through either instance gathers every owner's part (the owners
  // accepted the caller's forwarded token) and equals the model.
  for (auto* via : {&a, &b}) {
    std::vector<std::string> got;
    std::string cursor;
    for (int guard = 0; guard < 100; ++guard) {
      auto r = request(via->port(), "GET",
                       "/v1/stores/orders-eu/keys?limit=64" + (cursor.empty() ? "" : "&cursor=" + cursor), orders);
      REQUIRE(r);
      REQUIRE_MESSAGE(r->status == 200, r->body);
      auto body = r->body_json();
      for (const auto& e : body["data"]) got.push_back(e["key"].get<std::string>());
      if (body["metadata"]["next"].is_null()) break;
      cursor = body["metadata"]["next"].get<std::string>();
    }
    std::vector<std::string> expect;
    for (const auto& [k, v] : model) expect.push_back(k);
    CHECK(got == expect);
    auto count = request(via->port(), "GET", "/v1/stores/orders-eu/count", orders);
    REQUIRE(count);
    CHECK(count->body_json()["count"] == model.size());
  }

  // Point lookups through a: keys b owns are forwarded with the caller's token and
  // answered; with the users token a refuses before forwarding anything.
  size_t forwarded = 0;
  for (int i = 0; i < 400; i += 7) {
    auto key = "k-" + std::to_string(i);
    auto ok = request(a.port(), "GET", "/v1/stores/orders-eu/keys/" + key, orders);
    REQUIRE(ok);
    CHECK_MESSAGE(ok->status == 200, key << ": " << ok->body);
    if (ok->headers.count("x-kstate-forwarded-to")) ++forwarded;
    auto refused = request(a.port(), "GET", "/v1/stores/orders-eu/keys/" + key, users);
    REQUIRE(refused);
    CHECK(refused->status == 403);
    CHECK(refused->headers.count("x-kstate-forwarded-to") == 0);
  }
  if (!b_parts.empty()) CHECK(forwarded > 0);

  // Internal requests (hop header and partitions, as instances send them) are the
  // group's own: a client's token, even one with every scope, does not open them, and a
  // request signed with the group's secret needs no token (the instance that took the
  // client's request checked its scopes; tokens are never sent between instances).
  if (!b_parts.empty()) {
    std::string list;
    for (int p : b_parts) list += (list.empty() ? "" : ",") + std::to_string(p);
    const std::string part = "/v1/stores/orders-eu/keys?limit=10&partitions=" + list;
    const std::vector<std::pair<std::string, std::string>> hop{{"X-Kstate-Hop", "1"}};
    for (const auto* token : {&users, &orders, &none}) {
      auto r = request(b.port(), "GET", part, *token, "", hop);
      REQUIRE(r);
      CHECK(r->status == 401);
      CHECK(r->body_json()["error_code"] == 40102);
    }
    const auto secrets = consume_all(app + "-peer-secret", 1);
    REQUIRE(secrets.size() == 1);
    REQUIRE(secrets[0].value);
    const std::vector<std::pair<std::string, std::string>> signed_hop{
        {"X-Kstate-Hop", "1"}, {"X-Kstate-Peer", peer_signature(*secrets[0].value, "GET", part, "")}};
    auto r = request(b.port(), "GET", part, none, "", signed_hop);
    REQUIRE(r);
    CHECK_MESSAGE(r->status == 200, r->body);
  }

  // Tokens never reach the logs (debug level logs every request).
  a.terminate();
  b.terminate();
  for (auto* p : {&a, &b}) {
    std::ifstream in(p->log_path());
    std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(log.size() > 0);
    for (const auto& t : tokens)
      if (!t.secret.empty())
        CHECK_MESSAGE(log.find(t.secret) == std::string::npos, "token '" << t.name << "' in " << p->log_path());
  }
}

TEST_CASE("kstate refuses a state directory that others can write, and creates a new one 0700") {
  auto topic = unique_name("statedir");
  create_topic(topic, 1);
  auto dir = temp_dir("statedir");
  auto state = dir + "/open";
  sh("mkdir -p '" + state + "' && chmod 777 '" + state + "'");
  kstate_process ks(unique_name("statedir-app"), {{"s", topic}}, state);
  ks.start();
  const int rc = ks.wait_exit();
  CHECK(rc > 0);
  CHECK(rc < 128);  // exited with an error, did not crash
  std::ifstream in(ks.log_path());
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_MESSAGE(log.find("writable by other users") != std::string::npos, log);
  CHECK(log.find("chmod 700") != std::string::npos);

  auto fresh = dir + "/fresh";
  kstate_process ok(unique_name("statedir-app"), {{"s", topic}}, fresh);
  ok.start();
  ok.wait_ready();
  CHECK(sh("stat -c %a '" + fresh + "'") == "700\n");
  CHECK(ok.terminate() == 0);
}
