#include "api/change_snapshot.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <future>
#include <mutex>
#include <thread>

#include "api/params.h"
#include "http/url.h"
#include "query/cursor.h"
#include "query/key_format.h"

namespace kstate::server::api {

namespace {

// How often, and how far apart, a page that got 503 (an owner moving, a partition
// catching up) is asked again before the snapshot gives up.
constexpr int page_attempts = 20;
constexpr std::chrono::milliseconds page_retry_pause{500};

// {"0": 12, "3": 40} as a position; nullopt when it is not one.
std::optional<position> position_of(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  position out;
  for (const auto& [k, v] : j.items()) {
    int32_t p = 0;
    auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), p);
    if (ec != std::errc() || end != k.data() + k.size() || !v.is_number_integer()) return std::nullopt;
    out.set(p, v.get<int64_t>());
  }
  return out;
}

std::string detail_of(const http::response& r) {
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_object() && j.contains("detail") && j["detail"].is_string()) return j["detail"].get<std::string>();
  return "status " + std::to_string(r.status);
}

}  // namespace

table_snapshot::table_snapshot(http::async_handler self, std::string store, ingest::feed_selection sel,
                               std::string authorization, uint32_t page_limit)
    : self_(std::move(self)),
      store_(std::move(store)),
      sel_(std::move(sel)),
      authorization_(std::move(authorization)),
      page_limit_(std::max<uint32_t>(1, page_limit)) {}

http::response table_snapshot::ask(const std::string& method, const std::string& target, std::string body) const {
  for (int attempt = 1;; ++attempt) {
    auto req = std::make_shared<http::request>();
    req->method = method;
    req->target = target;
    if (auto s = http::parse_target(req->target, *req); !s.ok()) {
      http::response r;
      r.status = 500;
      r.body = nlohmann::json{{"detail", "a snapshot request is malformed: " + s.message()}}.dump();
      return r;
    }
    req->headers.emplace_back("accept", "application/json");
    if (!authorization_.empty()) req->headers.emplace_back("authorization", authorization_);
    if (!body.empty()) req->headers.emplace_back("content-type", "application/json");
    req->body = body;
    auto answer = std::make_shared<std::promise<http::response>>();
    auto once = std::make_shared<std::once_flag>();
    auto got = answer->get_future();
    self_(*req, [answer, once](http::response r) { std::call_once(*once, [&] { answer->set_value(std::move(r)); }); });
    http::response r;
    try {
      r = got.get();
    } catch (const std::future_error&) {
      r.status = 500;
      r.body = R"({"detail":"the API did not answer"})";
    }
    if (r.status != 503 || attempt == page_attempts) return r;
    std::this_thread::sleep_for(page_retry_pause);
  }
}

result<bool> table_snapshot::next(std::vector<std::string>& out) {
  if (done_) return false;
  http::response r;
  const std::string path = "/v1/stores/" + http::percent_encode(store_) + "/keys";
  if (!sel_.keys.empty()) {
    nlohmann::json body{{"key_format", "base64url"}, {"keys", nlohmann::json::array()}};
    for (const auto& k : sel_.keys) body["keys"].push_back(query::base64url_encode(k));
    r = ask("POST", path + ":batchGet", body.dump());
  } else {
    std::string target = path + "?key_format=base64url&limit=" + std::to_string(page_limit_);
    for (auto [name, v] : {std::pair{"from", &sel_.from}, std::pair{"to", &sel_.to}, std::pair{"prefix", &sel_.prefix}})
      if (*v) target += std::string("&") + name + "=" + query::base64url_encode(**v);
    if (cursor_) target += "&cursor=" + *cursor_;
    r = ask("GET", target, {});
  }
  if (r.status != 200) return status::unavailable("reading the snapshot: " + detail_of(r));
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || !j.contains("metadata"))
    return status::internal("a page of the snapshot is malformed");
  const auto& meta = j["metadata"];
  auto pos = meta.is_object() && meta.contains("position") ? position_of(meta["position"]) : std::nullopt;
  if (!pos) return status::internal("a page of the snapshot names no position");
  for (const auto& e : j["data"]) out.push_back(e.dump());
  page pg;
  pg.pos = std::move(*pos);
  if (sel_.keys.empty() && meta.contains("next") && meta["next"].is_string()) {
    cursor_ = meta["next"].get<std::string>();
    // The cursor names the last key of the page: the keys after it belong to the next.
    auto c = query::decode_cursor(*cursor_, keys_fingerprint(store_, false, sel_.from, sel_.to, sel_.prefix));
    if (!c.ok()) return status::internal("a page of the snapshot has a cursor it cannot be resumed from");
    pg.last_key = std::move(c->last_key);
  } else {
    done_ = true;
  }
  pages_.push_back(std::move(pg));
  return true;
}

std::map<int32_t, int64_t> table_snapshot::follow_from() const {
  std::map<int32_t, int64_t> out;
  for (const auto& pg : pages_)
    for (const auto& [p, next] : pg.pos) {
      auto [it, added] = out.emplace(p, next);
      if (!added) it->second = std::min(it->second, next);
    }
  return out;
}

bool table_snapshot::reflected(int32_t partition, int64_t offset, std::string_view key) const {
  // The page covering `key`: the first whose last key is not before it (pages are in
  // key order and the last one reaches the end of the range).
  auto it = std::partition_point(pages_.begin(), pages_.end(),
                                 [&](const page& pg) { return pg.last_key && std::string_view(*pg.last_key) < key; });
  if (it == pages_.end()) return false;
  auto at = it->pos.at(partition);
  return at && offset < *at;
}

}  // namespace kstate::server::api
