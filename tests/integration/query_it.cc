// The query API against independent models: ranges, prefixes, pages and scans over
// binary and UTF-8 keys written by the Java client; read-your-writes; bad requests.
#include <doctest/doctest.h>

#include <atomic>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {

std::string b64url(std::string_view bytes) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += a[v >> 18];
    out += a[(v >> 12) & 63];
    out += a[(v >> 6) & 63];
    out += a[v & 63];
  }
  if (bytes.size() - i == 1) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    out += a[v >> 18];
    out += a[(v >> 12) & 63];
  } else if (bytes.size() - i == 2) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += a[v >> 18];
    out += a[(v >> 12) & 63];
    out += a[(v >> 6) & 63];
  }
  return out;
}

// How a key appears in answers: strings as themselves, bytes keys as base64url.
struct store_under_test {
  std::string name;
  bool binary;
  table_model model;
  std::string encode(const std::string& k) const { return binary ? b64url(k) : k; }
  std::string param(const std::string& k) const { return pct(encode(k)); }
};

// The model's answer: keys in [from, to) with the prefix, in byte order (or reversed).
std::vector<std::string> expected_range(const table_model& m, const std::optional<std::string>& from,
                                        const std::optional<std::string>& to, const std::optional<std::string>& prefix,
                                        bool desc) {
  std::vector<std::string> out;
  for (const auto& [k, v] : m) {
    if (from && k < *from) continue;
    if (to && !(k < *to)) continue;
    if (prefix && k.compare(0, prefix->size(), *prefix) != 0) continue;
    out.push_back(k);
  }
  if (desc) std::reverse(out.begin(), out.end());
  return out;
}

// Pages through a range with `limit`, following metadata.next; returns the keys as the
// API rendered them, checking every page on the way.
std::vector<std::string> page_all(http_client& c, const std::string& base, int limit, size_t* pages = nullptr,
                                  std::chrono::milliseconds pause = std::chrono::milliseconds(0)) {
  std::vector<std::string> keys;
  std::string cursor;
  for (int guard = 0; guard < 100000; ++guard) {
    auto target = base + (base.find('?') == std::string::npos ? "?" : "&") + "limit=" + std::to_string(limit);
    if (!cursor.empty()) target += "&cursor=" + cursor;
    auto a = c.get(target);
    REQUIRE(a);
    REQUIRE_MESSAGE(a->status == 200, target << " -> " << a->body);
    auto body = a->body_json();
    CHECK(body["data"].size() <= static_cast<size_t>(limit));
    for (const auto& e : body["data"]) keys.push_back(e["key"].get<std::string>());
    if (pages) ++*pages;
    if (pause.count()) std::this_thread::sleep_for(pause);
    if (body["metadata"]["next"].is_null()) {
      CHECK(a->headers.count("link") == 0);
      return keys;
    }
    CHECK(a->headers["link"].find("rel=\"next\"") != std::string::npos);
    cursor = body["metadata"]["next"].get<std::string>();
  }
  FAIL("paging did not end");
  return keys;
}

}  // namespace

TEST_CASE("query API against models: ranges, prefixes, pages, scans, counts, batches, freshness, bad input") {
  auto dir = temp_dir("query");
  auto bin_topic = unique_name("qbin"), str_topic = unique_name("qstr");
  create_topic(bin_topic, 6);
  create_topic(str_topic, 6);
  std::mt19937 rng(4242);

  store_under_test bin{"bin", true, {}}, str{"str", false, {}};

  // Binary keys: 0..10 random bytes (NUL, 0xff, '/', '%' all likely), the empty key included.
  std::vector<produced> bin_recs;
  std::uniform_int_distribution<int> len(0, 10), byte(0, 255), small(0, 7);
  for (int i = 0; i < 3000; ++i) {
    std::string k;
    int n = len(rng);
    for (int j = 0; j < n; ++j) {
      // Bias towards a few bytes so prefixes share members.
      int b = small(rng) < 5 ? std::string("\x00\x01/%a\xff", 6)[small(rng) % 6] & 0xff : byte(rng);
      k.push_back(static_cast<char>(b));
    }
    produced r{k, R"({"i":)" + std::to_string(i) + "}"};
    if (i % 17 == 0) r.value = std::nullopt;  // tombstones too
    bin_recs.push_back(r);
    apply_record(bin.model, r);
  }
  produce_bytes(bin_topic, bin_recs);

  // UTF-8 keys built from pieces that need percent-encoding, multi-byte and 4-byte
  // characters, and the empty string.
  const std::vector<std::string> pieces{
      "a", "b", "/", "%", "?", "#", " ", "+", "&", "\xc3\xa9", "\xd0\xba\xd0\xbb", "\xf0\x9f\x98\x80", "z", "~"};
  std::uniform_int_distribution<int> plen(0, 5), pick(0, static_cast<int>(pieces.size()) - 1);
  std::vector<produced> str_recs;
  for (int i = 0; i < 2000; ++i) {
    std::string k;
    int n = plen(rng);
    for (int j = 0; j < n; ++j) k += pieces[pick(rng)];
    produced r{k, R"({"s":)" + std::to_string(i) + "}"};
    str_recs.push_back(r);
    apply_record(str.model, r);
  }
  produce_bytes(str_topic, str_recs);
  REQUIRE(str.model.count(""));  // the empty key is in play

  kstate_process ks(unique_name("query-app"),
                    {{"bin", bin_topic, "json", "", "bytes"}, {"str", str_topic, "json", "", "string"}},
                    dir + "/state");
  ks.start();
  ks.wait_ready();
  http_client c(ks.port());

  SUBCASE("random ranges and prefixes, both orders, paged with random limits, equal the model") {
    for (auto* s : {&bin, &str}) {
      std::vector<std::string> keys;
      for (const auto& [k, v] : s->model) keys.push_back(k);
      std::uniform_int_distribution<size_t> any(0, keys.size() - 1);
      std::uniform_int_distribution<int> coin(0, 3), limit(1, 7);
      for (int q = 0; q < 60; ++q) {
        std::optional<std::string> from, to, prefix;
        if (coin(rng) == 0) from = keys[any(rng)];
        if (coin(rng) == 0) to = keys[any(rng)];
        if (coin(rng) <= 1) {
          prefix = keys[any(rng)].substr(0, 1 + coin(rng) % 2);
          // A string store's prefix must be whole UTF-8 characters (else 400, as tested below).
          while (!s->binary && !prefix->empty() && (static_cast<unsigned char>(prefix->back()) & 0xC0) == 0x80)
            prefix->pop_back();
          while (!s->binary && !prefix->empty() && static_cast<unsigned char>(prefix->back()) >= 0xC0)
            prefix->pop_back();
        }
        bool desc = coin(rng) % 2;
        std::string base = "/v1/stores/" + s->name + "/keys?order=" + (desc ? "desc" : "asc");
        if (from) base += "&from=" + s->param(*from);
        if (to) base += "&to=" + s->param(*to);
        if (prefix) base += "&prefix=" + s->param(*prefix);
        auto expected = expected_range(s->model, from, to, prefix, desc);
        std::vector<std::string> rendered;
        for (const auto& k : expected) rendered.push_back(s->encode(k));
        CHECK_MESSAGE(page_all(c, base, limit(rng)) == rendered, base);
      }
    }
  }

  SUBCASE("every limit from 1 to 7 covers each key exactly once; NDJSON equals the pages") {
    for (auto* s : {&bin, &str}) {
      std::vector<std::string> all;
      for (const auto& [k, v] : s->model) all.push_back(s->encode(k));
      for (int limit = 1; limit <= 7; ++limit) {
        // A prefix keeps each run short; the whole store once with the largest limit.
        auto base = "/v1/stores/" + s->name + "/keys";
        auto got = page_all(c, limit == 7 ? base : base + "?prefix=" + s->param(s->binary ? std::string(1, 'a') : "a"),
                            limit == 7 ? 1000 : limit);
        std::vector<std::string> want;
        if (limit == 7) want = all;
        else
          for (const auto& k : expected_range(s->model, {}, {}, std::string(1, 'a'), false))
            want.push_back(s->encode(k));
        CHECK(got == want);
        CHECK(std::set<std::string>(got.begin(), got.end()).size() == got.size());
      }
      auto scan = c.get("/v1/stores/" + s->name + "/keys", {{"Accept", "application/x-ndjson"}});
      REQUIRE(scan);
      REQUIRE(scan->status == 200);
      CHECK(scan->headers["content-type"] == "application/x-ndjson");
      std::map<std::string, std::string> by_rendered;
      for (const auto& [k, v] : s->model) by_rendered[s->encode(k)] = v;
      std::vector<std::string> lines;
      std::istringstream in(scan->body);
      std::string line;
      while (std::getline(in, line)) {
        auto e = json::parse(line);
        auto key = e["key"].get<std::string>();
        lines.push_back(key);
        REQUIRE(by_rendered.count(key));
        CHECK(e["value"] == json::parse(by_rendered.at(key)));
      }
      CHECK(lines == all);
      // The same as the JSON pages concatenated.
      CHECK(lines == page_all(c, "/v1/stores/" + s->name + "/keys", 333));
    }
  }

  SUBCASE("values, count and batchGet equal the model") {
    for (auto* s : {&bin, &str}) {
      auto count = c.get("/v1/stores/" + s->name + "/count");
      REQUIRE(count);
      REQUIRE(count->status == 200);
      CHECK(count->body_json()["count"] == s->model.size());
      CHECK(count->body_json()["exact"] == true);

      auto page = c.get("/v1/stores/" + s->name + "/keys?limit=1000");
      REQUIRE(page);
      auto body = page->body_json();
      for (const auto& e : body["data"]) {
        std::string key = e["key"].get<std::string>();
        auto it = std::find_if(s->model.begin(), s->model.end(), [&](auto& kv) { return s->encode(kv.first) == key; });
        REQUIRE(it != s->model.end());
        CHECK(e["value"] == json::parse(it->second));
      }

      json req = json::object();
      req["keys"] = json::array();
      std::set<std::string> want_found, want_missing;
      int n = 0;
      for (const auto& [k, v] : s->model) {
        if (n++ % 40) continue;
        req["keys"].push_back(s->encode(k));
        want_found.insert(s->encode(k));
      }
      for (const auto& extra : {std::string("\x7f\x7f\x7f never") + '\0', std::string("missing-key")}) {
        if (s->model.count(extra)) continue;
        req["keys"].push_back(s->encode(extra));
        want_missing.insert(s->encode(extra));
      }
      auto b = c.post("/v1/stores/" + s->name + "/keys:batchGet", "application/json", req.dump());
      REQUIRE(b);
      REQUIRE_MESSAGE(b->status == 200, b->body);
      auto bb = b->body_json();
      std::set<std::string> found, missing;
      for (const auto& e : bb["data"]) found.insert(e["key"].get<std::string>());
      for (const auto& m : bb["missing"]) missing.insert(m.get<std::string>());
      CHECK(found == want_found);
      CHECK(missing == want_missing);
    }
  }

  SUBCASE("min_position: a read with the offset of a just-produced record sees that record") {
    interactive_producer producer(str_topic);
    for (int i = 0; i < 25; ++i) {
      auto [p, o] = producer.send({std::string("rw-key"), R"({"write":)" + std::to_string(i) + "}"});
      auto a = c.get("/v1/stores/str/keys/rw-key?min_position=" + std::to_string(p) + ":" + std::to_string(o));
      REQUIRE(a);
      REQUIRE_MESSAGE(a->status == 200, a->body);
      CHECK(a->body_json()["value"]["write"] == i);
      CHECK(a->body_json()["offset"] == o);
      CHECK(a->body_json()["position"][std::to_string(p)].get<int64_t>() > o);
    }
    // The header form, and a position that is never reached within the timeout.
    auto [p, o] = producer.send({std::string("rw-key"), R"({"write":"last"})"});
    auto h =
        c.get("/v1/stores/str/keys/rw-key", {{"X-Kstate-Min-Position", std::to_string(p) + ":" + std::to_string(o)}});
    REQUIRE(h);
    CHECK(h->body_json()["value"]["write"] == "last");
    auto late = c.get("/v1/stores/str/keys/rw-key?timeout_ms=200&min_position=" + std::to_string(p) + ":" +
                      std::to_string(o + 1000));
    REQUIRE(late);
    CHECK(late->status == 503);
    CHECK(late->body_json()["error_code"] == 50304);
    CHECK(late->headers.count("retry-after") == 1);
  }

  SUBCASE("bad requests get a 4xx problem+json, and the server keeps serving") {
    struct row {
      std::string target;
      int status;
      int error_code;
    };
    const row rows[] = {
        {"/v1/stores/str/keys/%zz", 400, 40003},
        {"/v1/stores/str/keys/%C0%AF", 400, 40002},  // overlong UTF-8 with key_format=string
        {"/v1/stores/bin/keys/***", 400, 40002},     // not base64url
        {"/v1/stores/bin/keys/abc?key_format=long", 400, 40002},
        {"/v1/stores/str/keys?limit=0", 400, 40005},
        {"/v1/stores/str/keys?limit=1000000000", 400, 40005},
        {"/v1/stores/str/keys?limit=ten", 400, 40005},
        {"/v1/stores/str/keys?cursor=AAAAAAAAAAAAAAAA", 400, 40004},
        {"/v1/stores/str/keys?cursor=not*base64", 400, 40004},
        {"/v1/stores/str/keys?colour=red", 400, 40007},
        {"/v1/stores/str/keys?order=sideways", 400, 40001},
        {"/v1/stores/str/keys?key_format=xml", 400, 40001},
        {"/v1/stores/str/keys/a?min_position=zero", 400, 40006},
        {"/v1/stores/str/keys/a?min_position=1:2,", 400, 40006},
        {"/v1/stores/nope/keys", 404, 40401},
        {"/v1/nothing", 404, 40403},
    };
    for (const auto& r : rows) {
      auto a = c.get(r.target);
      REQUIRE_MESSAGE(a, r.target);
      CHECK_MESSAGE(a->status == r.status, r.target << " -> " << a->body);
      CHECK_MESSAGE(a->headers["content-type"] == "application/problem+json", r.target);
      CHECK_MESSAGE(a->body_json()["error_code"] == r.error_code, r.target);
      auto ok = c.get("/v1/stores/str/count");
      REQUIRE(ok);
      CHECK(ok->status == 200);
    }
    // A cursor from one query is refused by another.
    auto first = c.get("/v1/stores/str/keys?limit=1");
    REQUIRE(first);
    auto token = first->body_json()["metadata"]["next"].get<std::string>();
    auto other = c.get("/v1/stores/str/keys?limit=1&order=desc&cursor=" + token);
    REQUIRE(other);
    CHECK(other->status == 400);
    CHECK(other->body_json()["error_code"] == 40004);
    // A damaged cursor: flip one character.
    std::string damaged = token;
    damaged[damaged.size() / 2] = damaged[damaged.size() / 2] == 'A' ? 'B' : 'A';
    auto d = c.get("/v1/stores/str/keys?limit=1&cursor=" + damaged);
    REQUIRE(d);
    CHECK(d->status == 400);

    // Wrong media types.
    auto na = c.get("/v1/stores/str/keys", {{"Accept", "text/html"}});
    REQUIRE(na);
    CHECK(na->status == 406);
    auto um = c.post("/v1/stores/str/keys:batchGet", "text/plain", "keys");
    REQUIRE(um);
    CHECK(um->status == 415);
    auto bb = c.post("/v1/stores/str/keys:batchGet", "application/json", "{\"keys\": 5}");
    REQUIRE(bb);
    CHECK(bb->status == 400);
    json many = {{"keys", json::array()}};
    for (int i = 0; i < 1001; ++i) many["keys"].push_back("k" + std::to_string(i));
    auto big = c.post("/v1/stores/str/keys:batchGet", "application/json", many.dump());
    REQUIRE(big);
    CHECK(big->status == 413);

    // A 1 MB header: 431 on that connection; others are served.
    http_client huge(ks.port());
    auto h = huge.get("/v1/stores/str/count", {{"X-Big", std::string(1 << 20, 'x')}});
    if (h) CHECK(h->status == 431);
    auto after = c.get("/v1/stores/str/count");
    REQUIRE(after);
    CHECK(after->status == 200);
  }

  CHECK(ks.terminate() == 0);
}

TEST_CASE("paging is exactly-once and in order while ingest writes") {
  auto dir = temp_dir("paging");
  auto topic = unique_name("paging");
  create_topic(topic, 6);
  std::vector<produced> initial;
  for (int i = 0; i < 3000; ++i) {
    char k[16];
    std::snprintf(k, sizeof k, "p-%05d", i * 2);  // even numbers; writers add odd ones
    initial.push_back({std::string(k), R"({"v":0})"});
  }
  produce_bytes(topic, initial);
  kstate_process ks(unique_name("paging-app"), {{"s", topic}}, dir + "/state");
  ks.start();
  ks.wait_ready();

  std::atomic<bool> stop{false};
  std::atomic<int> written{0};
  std::thread writer([&] {
    interactive_producer p(topic);
    for (int i = 0; !stop && i < 3000; ++i) {
      char k[16];
      // New keys between existing ones, and overwrites of existing ones.
      std::snprintf(k, sizeof k, "p-%05d", (i % 2) ? i * 2 + 1 : i * 2);
      p.send({std::string(k), R"({"v":)" + std::to_string(i + 1) + "}"});
      ++written;
    }
  });
  // Page only once the writer is producing, and slowly enough that writes land
  // between pages all the way through.
  while (written < 20) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http_client c(ks.port());
  size_t pages = 0;
  int before = written;
  auto keys = page_all(c, "/v1/stores/s/keys", 7, &pages, std::chrono::milliseconds(8));
  int during = written - before;
  stop = true;
  writer.join();
  MESSAGE("paged " << keys.size() << " keys in " << pages << " pages while " << during << " records were written");
  CHECK(during >= 100);
  CHECK(std::is_sorted(keys.begin(), keys.end()));
  CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());  // no key twice
  std::set<std::string> seen(keys.begin(), keys.end());
  for (const auto& r : initial) CHECK_MESSAGE(seen.count(*r.key) == 1, *r.key);  // none missed
  CHECK(ks.terminate() == 0);
}
