// Access control: token file parsing, scope matching, the hash helper (against
// published SHA-256 vectors), bearer-header handling, reloads, CORS, and the state
// directory check.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "server/app.h"
#include "server/auth.h"
#include "server/cors.h"

using namespace kstate;
using namespace kstate::server;

namespace {

std::string temp_path(const std::string& base) {
  std::random_device rd;
  return (std::filesystem::temp_directory_path() / (base + "-" + std::to_string(rd()) + std::to_string(::getpid())))
      .string();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// SHA-256("abc") and SHA-256("") from FIPS 180-2 / NIST's examples.
constexpr const char* sha_abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr const char* sha_empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// NIST's two-block message "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".
constexpr const char* sha_448 = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";

}  // namespace

TEST_CASE("sha256_hex matches the published test vectors") {
  CHECK(sha256_hex("abc") == sha_abc);
  CHECK(sha256_hex("") == sha_empty);
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") == sha_448);
  // Bytes, not C strings: an embedded NUL is part of the input.
  CHECK(sha256_hex(std::string("a\0b", 3)) != sha256_hex("a"));
}

TEST_CASE("random tokens are 43 base64url characters and differ") {
  auto a = random_token(), b = random_token();
  CHECK(a.size() == 43);
  CHECK(a != b);
  for (char c : a) CHECK((std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'));
}

TEST_CASE("store scopes: exact names, prefixes and the wildcard") {
  struct row {
    std::vector<std::string> scopes;
    std::string store;
    bool allowed;
  };
  const row rows[] = {
      {{"orders"}, "orders", true},
      {{"orders"}, "orders-eu", false},  // a name is not a prefix
      {{"orders"}, "order", false},
      {{"orders*"}, "orders", true},  // a prefix covers the name itself
      {{"orders*"}, "orders-eu", true},
      {{"orders*"}, "order", false},
      {{"orders*"}, "users", false},
      {{"*"}, "anything", true},
      {{}, "orders", false},  // no stores scope: no store
      {{"users", "orders*"}, "orders.v2", true},
      {{"users", "orders*"}, "payments", false},
      {{"Orders"}, "orders", false},  // case matters, like store names
  };
  for (const auto& r : rows) {
    CAPTURE(r.store);
    token_scopes s;
    s.stores = r.scopes;
    CHECK(s.store_allowed(r.store) == r.allowed);
  }
}

TEST_CASE("a token file is parsed with names, hashes and scopes") {
  auto t = parse_token_file(std::string(R"(
tokens:
  - name: dash
    sha256: )") + sha_abc + R"(
    stores: ["orders*", users]
    cluster: true
  - name: scraper
    sha256: )" + std::string(sha_empty) +
                            R"(
    metrics: true
)");
  REQUIRE(t.ok());
  REQUIRE(t->size() == 2);
  CHECK((*t)[0].name == "dash");
  CHECK((*t)[0].scopes.stores == std::vector<std::string>{"orders*", "users"});
  CHECK((*t)[0].scopes.cluster);
  CHECK_FALSE((*t)[0].scopes.metrics);
  CHECK((*t)[0].hash[0] == 0xba);
  CHECK((*t)[0].hash[31] == 0xad);
  CHECK((*t)[1].scopes.stores.empty());
  CHECK((*t)[1].scopes.metrics);
  CHECK_FALSE((*t)[1].scopes.cluster);
}

TEST_CASE("bad token files are refused with the entry and key named") {
  struct row {
    std::string yaml;
    std::string expect;  // part of the error message
  };
  const std::string ok_hash = sha_abc;
  const row rows[] = {
      {"", "empty"},
      {"tokens: 3", "tokens: must be a list"},
      {"other: []", "unknown key"},
      {"tokens:\n  - {sha256: " + ok_hash + "}", "tokens[0].name: is required"},
      {"tokens:\n  - {name: a}", "tokens[0] (a).sha256: is required"},
      {"tokens:\n  - {name: a, sha256: abc}", "must be 64 hex digits"},
      {"tokens:\n  - {name: a, sha256: " + std::string(64, 'g') + "}", "must be 64 hex digits"},
      {"tokens:\n  - {name: a, sha256: " + ok_hash + "}\n  - {name: a, sha256: " + std::string(sha_empty) + "}",
       "duplicate name"},
      {"tokens:\n  - {name: a, sha256: " + ok_hash + "}\n  - {name: b, sha256: " + ok_hash + "}", "listed twice"},
      {"tokens:\n  - {name: a, sha256: " + ok_hash + ", stores: {x: 1}}", "stores: must be a list"},
      {"tokens:\n  - {name: a, sha256: " + ok_hash + ", stores: ['a*b']}", "may only end an entry"},
      {"tokens:\n  - {name: a, sha256: " + ok_hash + ", cluster: maybe}", "cluster: must be true or false"},
      {"tokens:\n  - {name: a, sha256: " + ok_hash + ", token: secret}", "tokens[0].token: unknown key"},
      {"tokens: [", "invalid YAML"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.yaml);
    auto t = parse_token_file(r.yaml, "tokens.yaml");
    REQUIRE_FALSE(t.ok());
    CHECK(t.error().message().find(r.expect) != std::string::npos);
    CHECK(t.error().message().rfind("tokens.yaml: ", 0) == 0);
  }
}

TEST_CASE("authenticate takes only a known bearer token") {
  std::vector<token_entry> tokens;
  auto e = parse_token_file(std::string("tokens:\n  - {name: dash, sha256: ") + sha_abc + ", stores: [orders]}\n");
  REQUIRE(e.ok());
  token_authenticator auth(std::move(e.value()));
  auto who = auth.authenticate("Bearer abc");
  REQUIRE(who);
  CHECK(who->name == "dash");
  CHECK(who->scopes.store_allowed("orders"));
  CHECK(auth.authenticate("bearer abc"));     // the scheme is case-insensitive
  CHECK(auth.authenticate("Bearer   abc "));  // extra spaces around the token
  CHECK_FALSE(auth.authenticate(std::nullopt));
  CHECK_FALSE(auth.authenticate("Bearer abd"));
  CHECK_FALSE(auth.authenticate("Bearer ABC"));  // tokens are case-sensitive
  CHECK_FALSE(auth.authenticate("Bearer "));
  CHECK_FALSE(auth.authenticate("Basic abc"));
  CHECK_FALSE(auth.authenticate("Bearerabc"));
  CHECK_FALSE(auth.authenticate("abc"));
  CHECK_FALSE(auth.authenticate(std::string("Bearer ") + sha_abc));  // the hash itself is not a token
}

TEST_CASE("a changed token file is picked up; a broken one keeps the previous tokens") {
  auto path = temp_path("kstate-tokens") + ".yaml";
  write_file(path, std::string("tokens:\n  - {name: one, sha256: ") + sha256_hex("t1") + "}\n");
  auto a = token_authenticator::from_file(path);
  REQUIRE(a.ok());
  auto& auth = *a.value();
  CHECK(auth.authenticate("Bearer t1"));
  CHECK_FALSE(auth.authenticate("Bearer t2"));

  // Replace t1 by t2. The file's mtime must differ: set it explicitly rather than wait.
  write_file(path, std::string("tokens:\n  - {name: two, sha256: ") + sha256_hex("t2") + "}\n");
  std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) + std::chrono::seconds(5));
  // Checked at most once a second: poll until the new list is in force (bounded).
  bool switched = false;
  for (int i = 0; i < 40 && !switched; ++i) {
    switched = auth.authenticate("Bearer t2") != nullptr;
    if (!switched) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(switched);
  CHECK_FALSE(auth.authenticate("Bearer t1"));

  write_file(path, "tokens: [");
  std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) + std::chrono::seconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  CHECK(auth.authenticate("Bearer t2"));  // still the last good list
  std::filesystem::remove(path);
}

TEST_CASE("the state directory is created 0700 and refused when others can write it") {
  auto base = temp_path("kstate-statedir");
  auto fresh = base + "/a/state";
  REQUIRE(secure_state_dir(fresh).ok());
  struct stat st {};
  REQUIRE(::stat(fresh.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(secure_state_dir(fresh).ok());  // again: still fine

  ::chmod(fresh.c_str(), 0770);
  auto s = secure_state_dir(fresh);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("writable by its group") != std::string::npos);
  CHECK(s.message().find("chmod 700") != std::string::npos);

  ::chmod(fresh.c_str(), 0757);
  s = secure_state_dir(fresh);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("writable by other users") != std::string::npos);

  ::chmod(fresh.c_str(), 0755);  // readable is the operator's choice; writable is not
  CHECK(secure_state_dir(fresh).ok());

  // Owned by someone else: only root can arrange that here.
  if (::geteuid() == 0) {
    REQUIRE(::chown(fresh.c_str(), 65534, 65534) == 0);
    s = secure_state_dir(fresh);
    REQUIRE_FALSE(s.ok());
    CHECK(s.message().find("owned by uid 65534") != std::string::npos);
    REQUIRE(::chown(fresh.c_str(), 0, 0) == 0);
  }

  auto file = base + "/file";
  write_file(file, "x");
  s = secure_state_dir(file);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("not a directory") != std::string::npos);
  std::filesystem::remove_all(base);
}

namespace {
// Runs `h` on a request and returns its (synchronous) answer.
http::response call(const http::async_handler& h, const http::request& req) {
  std::optional<http::response> out;
  h(req, [&](http::response r) { out = std::move(r); });
  REQUIRE(out);
  return *out;
}

std::optional<std::string> header_of(const http::response& r, std::string_view name) {
  for (const auto& [n, v] : r.headers)
    if (n == name) return v;
  return std::nullopt;
}

http::request request(std::string method, std::vector<std::pair<std::string, std::string>> headers) {
  http::request r;
  r.method = std::move(method);
  r.path = "/v1/stores/s/keys/k";
  r.headers = std::move(headers);
  return r;
}
}  // namespace

TEST_CASE("CORS: preflights from listed origins are answered; others are refused; answers name the origin") {
  int inner_calls = 0;
  http::async_handler inner = [&](const http::request&, http::responder reply) {
    ++inner_calls;
    http::response r;
    r.body = "{}";
    reply(std::move(r));
  };
  // No origins: the handler is returned unchanged, nothing is added.
  auto off = with_cors({}, inner);
  auto plain = call(off, request("GET", {{"origin", "https://dash.example.com"}}));
  CHECK_FALSE(header_of(plain, "Access-Control-Allow-Origin"));

  cors_config cfg;
  cfg.allowed_origins = {"https://dash.example.com"};
  cfg.max_age_s = 120;
  auto h = with_cors(cfg, inner);
  inner_calls = 0;

  auto pre = call(h, request("OPTIONS", {{"origin", "https://dash.example.com"},
                                         {"access-control-request-method", "POST"},
                                         {"access-control-request-headers", "authorization, content-type"}}));
  CHECK(pre.status == 204);
  CHECK(header_of(pre, "Access-Control-Allow-Origin") == "https://dash.example.com");
  CHECK(header_of(pre, "Access-Control-Allow-Methods") == "GET, HEAD, POST");
  CHECK(header_of(pre, "Access-Control-Allow-Headers")->find("Authorization") != std::string::npos);
  CHECK(header_of(pre, "Access-Control-Max-Age") == "120");
  CHECK_FALSE(header_of(pre, "Access-Control-Allow-Credentials"));
  CHECK(inner_calls == 0);  // answered before the API (and its authentication)

  auto other =
      call(h, request("OPTIONS", {{"origin", "https://evil.example"}, {"access-control-request-method", "GET"}}));
  CHECK(other.status == 403);
  CHECK_FALSE(header_of(other, "Access-Control-Allow-Origin"));
  auto bad_method = call(
      h, request("OPTIONS", {{"origin", "https://dash.example.com"}, {"access-control-request-method", "DELETE"}}));
  CHECK(bad_method.status == 405);

  auto get = call(h, request("GET", {{"origin", "https://dash.example.com"}}));
  CHECK(get.status == 200);
  CHECK(header_of(get, "Access-Control-Allow-Origin") == "https://dash.example.com");
  CHECK(header_of(get, "Access-Control-Expose-Headers")->find("X-Kstate-Position") != std::string::npos);
  CHECK(header_of(get, "Vary") == "Origin");
  auto foreign = call(h, request("GET", {{"origin", "https://evil.example"}}));
  CHECK(foreign.status == 200);  // the browser, not the server, withholds the answer
  CHECK_FALSE(header_of(foreign, "Access-Control-Allow-Origin"));
  auto no_origin = call(h, request("GET", {}));
  CHECK_FALSE(header_of(no_origin, "Access-Control-Allow-Origin"));
  CHECK(inner_calls == 3);
}
