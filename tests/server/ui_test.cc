#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "server/ui.h"
#include "http/url.h"

using namespace kstate::server;
namespace http = kstate::http;
using kstate::http::parse_target;
namespace fs = std::filesystem;

namespace {

// A built dashboard in a fresh temporary directory, removed afterwards; a secret file
// sits next to it, where no request may reach.
struct ui_fixture {
  fs::path base, dir;
  ui_fixture() {
    std::random_device rd;
    base = fs::temp_directory_path() / ("kstate-ui-test-" + std::to_string(rd()));
    dir = base / "dist";
    fs::create_directories(dir / "assets");
    write(dir / "index.html", "<!doctype html><title>kstate</title>");
    write(dir / "assets" / "index-Bx3_a9Zq.js", "console.log(1)");
    write(dir / "assets" / "index-Q1w2E3r4.css", "body{}");
    write(dir / "assets" / "index-Buy1C-92.css", "body{}");  // '-' inside the hash
    write(dir / "assets" / "index-abc.js", "short");
    write(dir / "assets" / "logo.svg", "<svg/>");
    write(dir / "favicon.ico", "ico");
    write(dir / "font-abcdefgh.woff2", "woff");
    write(dir / ".env", "dotfile-content");
    write(base / "secret.txt", "outside-content");
  }
  ~ui_fixture() {
    std::error_code ec;
    fs::remove_all(base, ec);
  }
  static void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

  http::response get(const std::string& target, const std::string& method = "GET") const {
    http::request req;
    req.method = method;
    req.target = target;
    auto st = parse_target(target, req);
    REQUIRE(st.ok());
    auto r = serve_ui(req, dir.string());
    REQUIRE(r.has_value());
    return *r;
  }
};

std::string header(const http::response& r, const std::string& name) {
  for (const auto& [n, v] : r.headers)
    if (n == name) return v;
  return {};
}

int error_code(const http::response& r) {
  auto j = nlohmann::json::parse(r.body);
  return j.at("error_code").get<int>();
}

}  // namespace

TEST_CASE("serve_ui: requests outside /ui are not its business") {
  ui_fixture f;
  http::request req;
  req.method = "GET";
  REQUIRE(parse_target("/v1/stores", req).ok());
  CHECK_FALSE(serve_ui(req, f.dir.string()).has_value());
  REQUIRE(parse_target("/uix", req).ok());
  CHECK_FALSE(serve_ui(req, f.dir.string()).has_value());
}

TEST_CASE("serve_ui: /ui and /ui/ answer index.html, never cached") {
  ui_fixture f;
  for (const char* t : {"/ui", "/ui/"}) {
    CAPTURE(t);
    auto r = f.get(t);
    CHECK(r.status == 200);
    CHECK(r.body == "<!doctype html><title>kstate</title>");
    CHECK(r.content_type == "text/html; charset=utf-8");
    CHECK(header(r, "Cache-Control") == "no-cache");
    CHECK(header(r, "Content-Security-Policy").find("default-src 'self'") != std::string::npos);
  }
}

TEST_CASE("serve_ui: app paths without an extension fall back to index.html") {
  ui_fixture f;
  for (const char* t : {"/ui/stores", "/ui/stores/users", "/ui/browse/users/"}) {
    CAPTURE(t);
    auto r = f.get(t);
    CHECK(r.status == 200);
    CHECK(r.content_type == "text/html; charset=utf-8");
    CHECK(header(r, "Cache-Control") == "no-cache");
  }
}

TEST_CASE("serve_ui: missing files and missing assets are 404, not index.html") {
  ui_fixture f;
  for (const char* t : {"/ui/assets/index-OLDHASH1.js", "/ui/nope.css", "/ui/assets/whatever"}) {
    CAPTURE(t);
    auto r = f.get(t);
    CHECK(r.status == 404);
    CHECK(r.content_type == "application/problem+json");
    CHECK(error_code(r) == 40403);
  }
}

TEST_CASE("serve_ui: content types follow the extension") {
  ui_fixture f;
  struct row {
    const char* target;
    const char* type;
  };
  for (auto [t, type] :
       {row{"/ui/assets/index-Bx3_a9Zq.js", "text/javascript; charset=utf-8"},
        row{"/ui/assets/index-Q1w2E3r4.css", "text/css; charset=utf-8"}, row{"/ui/assets/logo.svg", "image/svg+xml"},
        row{"/ui/favicon.ico", "image/x-icon"}, row{"/ui/font-abcdefgh.woff2", "font/woff2"},
        row{"/ui/index.html", "text/html; charset=utf-8"}}) {
    CAPTURE(t);
    auto r = f.get(t);
    CHECK(r.status == 200);
    CHECK(r.content_type == type);
    CHECK(header(r, "X-Content-Type-Options") == "nosniff");
  }
  CHECK(f.get("/ui/assets/index-Bx3_a9Zq.js").body == "console.log(1)");
}

TEST_CASE("serve_ui: hashed assets are immutable, everything else revalidates") {
  ui_fixture f;
  CHECK(header(f.get("/ui/assets/index-Bx3_a9Zq.js"), "Cache-Control") == "public, max-age=31536000, immutable");
  CHECK(header(f.get("/ui/assets/index-Q1w2E3r4.css"), "Cache-Control") == "public, max-age=31536000, immutable");
  CHECK(header(f.get("/ui/assets/index-Buy1C-92.css"), "Cache-Control") == "public, max-age=31536000, immutable");
  CHECK(header(f.get("/ui/assets/index-abc.js"), "Cache-Control") == "no-cache");
  // No hash in the name, or not under assets/: may change in place.
  CHECK(header(f.get("/ui/assets/logo.svg"), "Cache-Control") == "no-cache");
  CHECK(header(f.get("/ui/font-abcdefgh.woff2"), "Cache-Control") == "no-cache");
  CHECK(header(f.get("/ui/index.html"), "Cache-Control") == "no-cache");
}

TEST_CASE("serve_ui: paths that try to leave the directory are refused") {
  ui_fixture f;
  for (const char* t : {"/ui/../secret.txt", "/ui/%2e%2e/secret.txt", "/ui/%2E%2E/secret.txt",
                        "/ui/assets/..%2F..%2Fsecret.txt", "/ui/a%2Fb", "/ui/..%2Fsecret.txt", "/ui/%2e/index.html",
                        "/ui/assets//index-Bx3_a9Zq.js", "/ui/index.html%00.js", "/ui/.env", "/ui/..%5Csecret.txt"}) {
    CAPTURE(t);
    auto r = f.get(t);
    CHECK(r.status == 404);
    CHECK(error_code(r) == 40403);
    CHECK(r.body.find("outside-content") == std::string::npos);
    CHECK(r.body.find("dotfile-content") == std::string::npos);
  }
}

TEST_CASE("serve_ui: HEAD gets the headers without the body; other methods 405") {
  ui_fixture f;
  auto h = f.get("/ui/assets/index-Bx3_a9Zq.js", "HEAD");
  CHECK(h.status == 200);
  CHECK(h.body.empty());
  CHECK(h.content_type == "text/javascript; charset=utf-8");
  auto p = f.get("/ui/", "POST");
  CHECK(p.status == 405);
  CHECK(header(p, "Allow") == "GET, HEAD");
}

TEST_CASE("serve_ui: an unbuilt dashboard is a 404 that does not reveal where the files are") {
  ui_fixture f;
  fs::remove(f.dir / "index.html");
  auto r = f.get("/ui/");
  CHECK(r.status == 404);
  CHECK(error_code(r) == 40403);
  CHECK(r.body.find("not built") != std::string::npos);
  CHECK(r.body.find(f.dir.string()) == std::string::npos);
  CHECK(r.body.find("index.html") == std::string::npos);
}
