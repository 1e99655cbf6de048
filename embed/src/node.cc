// kstate::embed::node: server::app inside an application. Every query goes through the
// REST API's own handler in process (app::in_process_handler), so it is answered by the
// same code as over HTTP (parameter checks, limits, min_position waits, forwarding to
// owners, gathering parts, cursors); answers.cc reads the answers back. With
// routing::not_here a query that needs a partition held elsewhere is answered here,
// before the handler, with the owner's endpoint.

#include "kstate/kstate.h"

#include <condition_variable>
#include <future>
#include <mutex>

#include <nlohmann/json.hpp>

#include "answers.h"
#include "changes.h"
#include "http/url.h"
#include "ingest/change_feed.h"
#include "options.h"
#include "query/key_format.h"
#include "server/app.h"

namespace kstate::embed {

const char* version() noexcept { return KSTATE_LIBRARY_VERSION; }

const char* to_string(error_code c) noexcept {
  switch (c) {
    case error_code::invalid_argument: return "invalid_argument";
    case error_code::not_found: return "not_found";
    case error_code::not_here: return "not_here";
    case error_code::unavailable: return "unavailable";
    case error_code::deadline_exceeded: return "deadline_exceeded";
    case error_code::resource_exhausted: return "resource_exhausted";
    case error_code::internal: return "internal";
  }
  return "?";
}

namespace {

error make_error(error_code c, std::string message) { return error{c, std::move(message), {}, {}, 0, 0}; }

error from_status(const kstate::status& s) {
  switch (s.code()) {
    case status_code::invalid_argument: return make_error(error_code::invalid_argument, s.message());
    case status_code::not_found: return make_error(error_code::not_found, s.message());
    case status_code::unavailable:
    case status_code::io_error: return make_error(error_code::unavailable, s.message());
    case status_code::deadline_exceeded: return make_error(error_code::deadline_exceeded, s.message());
    case status_code::resource_exhausted: return make_error(error_code::resource_exhausted, s.message());
    default: return make_error(error_code::internal, s.message());
  }
}

// The key in a path or parameter: base64url, so any bytes travel.
std::string key_param(std::string_view key) { return http::percent_encode(query::base64url_encode(key)); }

// "&min_position=0:12,3:40&timeout_ms=..." for the read options.
std::string wait_params(const read_options& o) {
  std::string out;
  if (!o.min_position.empty()) {
    std::string list;
    for (const auto& [p, off] : o.min_position)
      list += (list.empty() ? "" : ",") + std::to_string(p) + ":" + std::to_string(off);
    out += "&min_position=" + http::percent_encode(list);
  }
  if (o.timeout) out += "&timeout_ms=" + std::to_string(o.timeout->count());
  return out;
}

// "&as_of=..." for the reads that take it.
std::string as_of_param(const read_options& o) { return o.as_of ? "&as_of=" + std::to_string(*o.as_of) : ""; }

}  // namespace

struct node::impl {
  server::app_config cfg;
  std::shared_ptr<detail::change_hub> hub = std::make_shared<detail::change_hub>();
  std::unique_ptr<server::app> app;
  http::async_handler api;

  // Queries in flight, so stop() destroys nothing they use (mu guards both).
  mutable std::mutex mu;
  mutable std::condition_variable idle;
  mutable int in_flight = 0;
  bool serving = false;
  mutable std::atomic<uint64_t> requests{0};

  // Admits a query while the node serves; the returned guard ends it.
  struct admission {
    const impl* i = nullptr;
    explicit operator bool() const { return i != nullptr; }
    admission(const admission&) = delete;
    admission& operator=(const admission&) = delete;
    admission(admission&& o) noexcept : i(std::exchange(o.i, nullptr)) {}
    explicit admission(const impl* x) : i(x) {}
    ~admission() {
      if (!i) return;
      std::lock_guard lock(i->mu);
      if (--i->in_flight == 0) i->idle.notify_all();
    }
  };
  admission admit() const {
    std::lock_guard lock(mu);
    if (!serving) return admission(nullptr);
    ++in_flight;
    return admission(this);
  }

  // One request through the API's handler, answered in this thread.
  http::response ask(std::string method, std::string target, std::string body = {}) const {
    auto req = std::make_shared<http::request>();
    req->method = std::move(method);
    req->target = std::move(target);
    if (auto s = http::parse_target(req->target, *req); !s.ok()) {
      http::response r;
      r.status = 400;
      r.body = nlohmann::json{{"detail", s.message()}, {"error_code", 40003}}.dump();
      return r;
    }
    req->headers.emplace_back("accept", "application/json");
    if (!body.empty()) req->headers.emplace_back("content-type", "application/json");
    req->body = std::move(body);
    req->request_id = "in-process-" + std::to_string(++requests);
    auto answer = std::make_shared<std::promise<http::response>>();
    auto once = std::make_shared<std::once_flag>();
    auto got = answer->get_future();
    api(*req, [answer, once](http::response r) { std::call_once(*once, [&] { answer->set_value(std::move(r)); }); });
    try {
      return got.get();
    } catch (const std::future_error&) {
      http::response r;  // the handler dropped its responder: a bug of the handler
      r.status = 500;
      r.body = R"({"detail":"the API did not answer","error_code":50001})";
      return r;
    }
  }

  std::string store_path(const std::string& store) const { return "/v1/stores/" + http::percent_encode(store); }

  // The failure not_here names: the owner of `partition` as the group says.
  error not_here(const view_def& v, int32_t partition) const {
    auto e = make_error(error_code::not_here, "partition " + std::to_string(partition) + " of '" + v.topic +
                                                  "' is not assigned to this instance");
    if (auto owner = app->membership().current()->owner(v.topic, partition)) e.owner = *owner;
    e.http_status = 503;
    e.rest_error_code = 50302;
    return e;
  }
  bool held_here(const view_def& v, int32_t partition) const {
    auto ps = app->ownership().partition(v.topic, partition);
    return ps && ps->assigned;
  }
  // With routing::not_here: the failure when one of the key's partitions is held
  // elsewhere; nullopt when the handler should answer (held here, or unknown store or
  // partition count, which it explains).
  std::optional<error> elsewhere(const std::string& store, const std::vector<std::string>& keys) const {
    const auto* v = app->queries().find_store(store);
    if (!v) return std::nullopt;
    for (const auto& k : keys) {
      auto loc = app->queries().locate(store, k);
      if (loc && !held_here(*v, loc->second)) return not_here(*v, loc->second);
    }
    return std::nullopt;
  }
  std::optional<error> elsewhere_any(const std::string& store) const {
    const auto* v = app->queries().find_store(store);
    if (!v) return std::nullopt;
    const int32_t n = app->ownership().partition_count(v->topic);
    for (int32_t p = 0; p < n; ++p)
      if (!held_here(*v, p)) return not_here(*v, p);
    return std::nullopt;
  }
};

node::node(std::unique_ptr<impl> i) : impl_(std::move(i)) {}
node::~node() { stop(); }

result<std::unique_ptr<node>> node::create(node_options options) {
  auto cfg = detail::to_config(options);
  if (!cfg.ok()) return from_status(cfg.error());
  auto i = std::make_unique<impl>();
  i->cfg = std::move(cfg.value());
  i->cfg.ingest.changes = i->hub;
  return std::unique_ptr<node>(new node(std::move(i)));
}

status node::start() {
  auto& i = *impl_;
  if (i.app) return make_error(error_code::invalid_argument, "the node was started already");
  auto created = server::app::create(i.cfg);
  if (!created.ok()) return from_status(created.error());
  i.app = std::move(created.value());
  if (auto s = i.app->start(); !s.ok()) {
    i.app->stop();
    return from_status(s);
  }
  i.api = i.app->in_process_handler();
  std::lock_guard lock(i.mu);
  i.serving = true;
  return done{};
}

bool node::ready() const {
  auto a = impl_->admit();
  return a && impl_->app->ownership().all_ready();
}

std::string node::fatal_error() const { return impl_->app ? impl_->app->fatal_error() : std::string(); }

void node::stop() {
  auto& i = *impl_;
  if (!i.app) return;
  {
    std::unique_lock lock(i.mu);
    i.serving = false;
    // Pending min_position waits answer now, so the queries in flight finish.
    i.app->end_waits();
    i.idle.wait(lock, [&] { return i.in_flight == 0; });
  }
  i.api = nullptr;
  // Ingest stops first, its last batches still delivered to the listeners (their
  // threads go on draining); then each listener delivers what it holds and ends.
  i.app->stop();
  for (const auto& s : i.hub->all()) s->cancel();
  i.app.reset();
}

std::string node::endpoint() const { return impl_->app ? impl_->app->endpoint() : impl_->cfg.advertised_endpoint; }
uint16_t node::http_port() const { return impl_->app ? impl_->app->http_port() : 0; }

namespace {
error stopped() { return make_error(error_code::unavailable, "the node is not running (start() it first)"); }
}  // namespace

result<key_result> node::get(const std::string& store, const std::string& key, const read_options& o) const {
  auto a = impl_->admit();
  if (!a) return stopped();
  const auto* v = impl_->app->queries().find_store(store);
  if (!v) return make_error(error_code::not_found, "no store '" + store + "'");
  if (o.route == routing::not_here)
    if (auto e = impl_->elsewhere(store, {key})) return *e;
  auto r = impl_->ask("GET", impl_->store_path(store) + "/keys/" + key_param(key) + "?key_format=base64url" +
                                 wait_params(o) + as_of_param(o));
  return detail::read_key_answer(*v, r);
}

result<multi_result> node::get_many(const std::string& store, const std::vector<std::string>& keys,
                                    const read_options& o) const {
  auto a = impl_->admit();
  if (!a) return stopped();
  const auto* v = impl_->app->queries().find_store(store);
  if (!v) return make_error(error_code::not_found, "no store '" + store + "'");
  if (o.route == routing::not_here)
    if (auto e = impl_->elsewhere(store, keys)) return *e;
  nlohmann::json body{{"keys", nlohmann::json::array()}, {"key_format", "base64url"}};
  for (const auto& k : keys) body["keys"].push_back(query::base64url_encode(k));
  auto params = wait_params(o);
  auto r =
      impl_->ask("POST", impl_->store_path(store) + "/keys:batchGet" + (params.empty() ? "" : "?" + params.substr(1)),
                 body.dump());
  auto out = detail::read_batch_answer(*v, keys, r);
  if (!out.ok()) return out;
  // An absent key's partition, as the batch answer names only the present ones.
  for (size_t n = 0; n < keys.size(); ++n)
    if (out->keys[n].partition < 0)
      if (auto loc = impl_->app->queries().locate(store, keys[n])) out->keys[n].partition = loc->second;
  for (auto& k : out->keys)
    if (auto it = out->pos.find(k.partition); it != out->pos.end()) k.pos = {{it->first, it->second}};
  return out;
}

result<range_page> node::range(const std::string& store, const range_options& q, const read_options& o) const {
  auto a = impl_->admit();
  if (!a) return stopped();
  const auto* v = impl_->app->queries().find_store(store);
  if (!v) return make_error(error_code::not_found, "no store '" + store + "'");
  if (o.route == routing::not_here)
    if (auto e = impl_->elsewhere_any(store)) return *e;
  std::string target = impl_->store_path(store) + "/keys?key_format=base64url";
  if (q.from) target += "&from=" + key_param(*q.from);
  if (q.to) target += "&to=" + key_param(*q.to);
  if (q.prefix) target += "&prefix=" + key_param(*q.prefix);
  if (q.descending) target += "&order=desc";
  if (q.limit) target += "&limit=" + std::to_string(q.limit);
  if (!q.cursor.empty()) target += "&cursor=" + http::percent_encode(q.cursor);
  auto r = impl_->ask("GET", target + wait_params(o) + as_of_param(o));
  return detail::read_range_answer(*v, r);
}

result<count_result> node::count(const std::string& store, const read_options& o) const {
  auto a = impl_->admit();
  if (!a) return stopped();
  if (!impl_->app->queries().find_store(store)) return make_error(error_code::not_found, "no store '" + store + "'");
  if (o.route == routing::not_here)
    if (auto e = impl_->elsewhere_any(store)) return *e;
  auto params = wait_params(o);
  auto r = impl_->ask("GET", impl_->store_path(store) + "/count" + (params.empty() ? "" : "?" + params.substr(1)));
  return detail::read_count_answer(r);
}

result<windows_result> node::windows(const std::string& store, const std::string& key, int64_t from, int64_t to,
                                     const read_options& o) const {
  auto a = impl_->admit();
  if (!a) return stopped();
  if (!impl_->app->queries().find_store(store)) return make_error(error_code::not_found, "no store '" + store + "'");
  if (!o.min_position.empty())
    return make_error(error_code::invalid_argument, "a key's windows take no min_position (as over HTTP)");
  if (o.route == routing::not_here)
    if (auto e = impl_->elsewhere(store, {key})) return *e;
  auto r = impl_->ask("GET", impl_->store_path(store) + "/windows/" + key_param(key) +
                                 "?key_format=base64url&from=" + std::to_string(from) + "&to=" + std::to_string(to));
  return detail::read_windows_answer(r);
}

result<windows_page> node::windows_range(const std::string& store, const windows_range_options& q,
                                         const read_options& o) const {
  auto a = impl_->admit();
  if (!a) return stopped();
  const auto* v = impl_->app->queries().find_store(store);
  if (!v) return make_error(error_code::not_found, "no store '" + store + "'");
  if (!o.min_position.empty())
    return make_error(error_code::invalid_argument, "a page of windows takes no min_position (as over HTTP)");
  if (o.route == routing::not_here)
    if (auto e = impl_->elsewhere_any(store)) return *e;
  std::string target = impl_->store_path(store) + "/windows?key_format=base64url&from=" + std::to_string(q.from) +
                       "&to=" + std::to_string(q.to);
  if (q.key_from) target += "&key_from=" + key_param(*q.key_from);
  if (q.key_to) target += "&key_to=" + key_param(*q.key_to);
  if (q.limit) target += "&limit=" + std::to_string(q.limit);
  if (!q.cursor.empty()) target += "&cursor=" + http::percent_encode(q.cursor);
  return detail::read_windows_range_answer(*v, impl_->ask("GET", target));
}

result<position> node::current_position(const std::string& store) const {
  auto a = impl_->admit();
  if (!a) return stopped();
  auto r = impl_->app->queries().current_position(store);
  if (!r.ok()) {
    auto code =
        r.failure() == query::failure_reason::unknown_query_store ? error_code::not_found : error_code::unavailable;
    return make_error(code, r.message());
  }
  position out;
  for (const auto& [p, off] : r.answer()) out[p] = off;
  return out;
}

result<subscription> node::listen(const std::string& store, std::function<void(const change&)> on_change,
                                  listen_options o) {
  if (!on_change) return make_error(error_code::invalid_argument, "listen: the callback is empty");
  bool known = false;
  for (const auto& v : impl_->cfg.views) known = known || v.name == store;
  if (!known) return make_error(error_code::not_found, "no store '" + store + "'");
  if (o.max_queued == 0) return make_error(error_code::invalid_argument, "listen: max_queued must be at least 1");
  auto s = std::make_shared<subscription::impl>(store, std::move(on_change), o.max_queued);
  std::weak_ptr<detail::change_hub> hub = impl_->hub;
  s->on_cancel = [hub, raw = s.get()] {
    if (auto h = hub.lock()) h->remove(raw);
  };
  impl_->hub->add(s);
  return subscription(std::move(s));
}

struct change_stream::impl {
  std::unique_ptr<ingest::change_feed> feed;
  ingest::feed_selection sel;
};

change_stream::change_stream() = default;
change_stream::change_stream(std::unique_ptr<impl> i) : impl_(std::move(i)) {}
change_stream::~change_stream() = default;
change_stream::change_stream(change_stream&&) noexcept = default;
change_stream& change_stream::operator=(change_stream&&) noexcept = default;

result<std::vector<feed_event>> change_stream::next(std::chrono::milliseconds wait, size_t max) {
  if (!impl_) return make_error(error_code::invalid_argument, "this change stream was moved from");
  position running = impl_->feed->position();
  auto got = impl_->feed->poll(impl_->sel, wait, max, 16u << 20);
  if (!got.ok()) return from_status(got.error());
  std::vector<feed_event> out;
  out.reserve(got->size());
  for (auto& c : *got) {
    running[c.partition] = c.offset + 1;
    out.push_back({std::move(c.key), std::move(c.value), c.partition, c.offset, c.timestamp, running, c.source_offset,
                   c.window_start, c.session_last});
  }
  return out;
}

position change_stream::pos() const { return impl_ ? impl_->feed->position() : position{}; }

result<change_stream> node::changes(const std::string& store, const changes_options& o) const {
  auto a = impl_->admit();
  if (!a) return stopped();
  const auto* v = impl_->app->queries().find_store(store);
  if (!v) return make_error(error_code::not_found, "no store '" + store + "'");
  if (!o.keys.empty() && (o.prefix || o.from || o.to))
    return make_error(error_code::invalid_argument, "keys cannot be combined with prefix, from or to");
  const int32_t count = impl_->app->ownership().partition_count(v->topic);
  if (count <= 0) return make_error(error_code::unavailable, "partition count of '" + v->topic + "' not known yet");
  std::map<int32_t, std::optional<int64_t>> start;
  if (o.keys.empty()) {
    for (int32_t p = 0; p < count; ++p) start[p] = std::nullopt;
  } else {
    for (const auto& k : o.keys)
      if (auto loc = impl_->app->queries().locate(store, k)) start[loc->second] = std::nullopt;
  }
  if (!o.from_position.empty())
    for (auto& [p, at] : start) {
      auto it = o.from_position.find(p);
      if (it == o.from_position.end())
        return make_error(error_code::invalid_argument, "from_position names no offset for partition " +
                                                            std::to_string(p) + ", which this stream follows");
      at = it->second;
    }
  auto feed = ingest::change_feed::open(impl_->cfg.ingest, *v, start, impl_->cfg.query.max_json_depth);
  if (!feed.ok()) return from_status(feed.error());
  auto i = std::make_unique<change_stream::impl>();
  i->feed = std::move(feed.value());
  i->sel = {o.keys, o.prefix, o.from, o.to};
  return change_stream(std::move(i));
}

}  // namespace kstate::embed
