// GET /v1/stores/{store}/changes: the changes a table view applies, as Server-Sent
// Events or NDJSON, from a position on (ingest/change_feed.h reads them from the
// view's topic, so any instance serves any subscription, through any rebalance).
//
// Every event names the position it completes (SSE `id:`, and "position" in its data):
// per partition followed, the next offset after the last change delivered. Resuming
// from it (from_position=, or SSE's Last-Event-ID) delivers every later change of the
// selection once, in each partition's order.

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "api/handlers.h"
#include "api/params.h"
#include "api/render.h"
#include "ingest/change_feed.h"
#include "server/json_render.h"

namespace kstate::server::api {

bool feed_threads::enter(uint32_t max) {
  std::lock_guard lock(mu_);
  if (open_ >= max) return false;
  ++open_;
  return true;
}

void feed_threads::leave() {
  std::lock_guard lock(mu_);
  if (--open_ == 0) idle_.notify_all();
}

uint32_t feed_threads::open() const {
  std::lock_guard lock(mu_);
  return open_;
}

void feed_threads::wait_all() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [this] { return open_ == 0; });
}

namespace {

enum class feed_media { sse, ndjson };

// "0:12,3:40" as a JSON string member value.
std::string position_text(const std::map<int32_t, int64_t>& pos) {
  position p;
  for (const auto& [part, next] : pos) p.set(part, next);
  return position_header(p);
}

// One event in the stream's framing: SSE (event, id, data) or one NDJSON line with its
// type.
void append_event(std::string& out, feed_media m, const char* type, const std::string& id, std::string_view data) {
  if (m == feed_media::sse) {
    out += "event: ";
    out += type;
    out += "\nid: ";
    out += id;
    out += "\ndata: ";
    out += data;
    out += "\n\n";
  } else {
    out += "{\"type\":\"";
    out += type;
    out += "\",";
    out.append(data.substr(1));  // the data object's members after its '{'
    out += '\n';
  }
}

// The thread a subscription reads on, and what it shares with the stream's body
// source: the server asks for the next piece (next()), the thread makes it (reading the
// topic for up to the heartbeat interval) and hands it back. Every piece is asked for
// only after the previous one was written, so a slow client holds at most one piece and
// the feed simply reads on later.
struct feed_shared {
  std::unique_ptr<ingest::change_feed> feed;
  ingest::feed_selection sel;
  view_def view;
  feed_media media = feed_media::sse;
  std::chrono::milliseconds heartbeat{5'000};
  size_t max_piece_bytes = 1u << 20;
  std::shared_ptr<feed_threads> threads;
  // Set once the instance shuts down: the stream then ends, and the client resumes on
  // another instance (may be null).
  const std::atomic<bool>* draining = nullptr;

  std::mutex mu;
  std::condition_variable wake;
  std::function<void(http::body_source::piece)> pending;  // guarded by mu
  bool stop = false;                                      // guarded by mu
  bool started = false;                                   // thread only
  bool ended = false;                                     // thread only

  // The thread: one piece per request for one, until the source is released.
  void run() {
    for (;;) {
      std::function<void(http::body_source::piece)> done;
      {
        std::unique_lock lock(mu);
        wake.wait(lock, [this] { return stop || pending; });
        if (stop) break;
        done = std::move(pending);
        pending = nullptr;
      }
      done(make_piece());
    }
    feed.reset();  // the consumer's connections close here, off the I/O threads
    threads->leave();
  }

  bool stopping() {
    if (draining && draining->load()) return true;
    std::lock_guard lock(mu);
    return stop;
  }

  // An event that only says where the feed is: {"position": "0:12,1:40"}, id the same.
  void append_position_event(std::string& out, const char* type) {
    const auto id = position_text(feed->position());
    std::string data = "{\"position\":";
    append_json_string(data, id);
    data += '}';
    append_event(out, media, type, id, data);
  }

  http::body_source::piece make_piece() {
    http::body_source::piece p;
    p.more = true;
    if (ended) {
      p.more = false;
      return p;
    }
    if (!started) {
      // Where the stream begins: resuming from this id misses nothing.
      started = true;
      append_position_event(p.data, "start");
      return p;
    }
    // Read until changes come or the heartbeat is due, in short slices so that a
    // released stream ends its thread soon.
    auto running = feed->position();  // the position each change completes
    const auto due = std::chrono::steady_clock::now() + heartbeat;
    while (!stopping()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(due - std::chrono::steady_clock::now());
      auto changes = feed->poll(sel, std::min(left, std::chrono::milliseconds(200)), 1'000, max_piece_bytes);
      if (!changes.ok()) {
        // The history this subscription needs is gone (or the feed failed): say so and
        // end, never skip ahead.
        const bool gone = changes.error().code() == status_code::not_found;
        std::string data = "{\"error\":";
        append_json_string(data, gone ? "history_gone" : "feed_failed");
        data += ",\"detail\":";
        append_json_string(data, changes.error().message());
        data += '}';
        append_event(p.data, media, "error", position_text(running), data);
        ended = true;
        p.more = false;
        return p;
      }
      for (const auto& c : *changes) {
        running[c.partition] = c.offset + 1;
        const auto id = position_text(running);
        std::string data = "{\"deleted\":";
        data += c.value ? "false" : "true";
        data += ",\"key\":";
        append_rendered_key(data, view.key_format, c.key);
        data += ",\"offset\":";
        append_int(data, c.offset);
        data += ",\"partition\":";
        append_int(data, c.partition);
        data += ",\"position\":";
        append_json_string(data, id);
        data += ",\"timestamp\":";
        append_int(data, c.timestamp);
        data += ",\"value\":";
        if (c.value) append_rendered_value(data, view.value_format, *c.value);
        else data += "null";
        data += '}';
        append_event(p.data, media, "change", id, data);
      }
      if (!p.data.empty()) return p;
      if (std::chrono::steady_clock::now() >= due) {
        // Nothing of the selection for a while: where the feed is now (every record
        // before it read), so that a resumption need not read them again, and so that
        // proxies see traffic.
        append_position_event(p.data, "position");
        return p;
      }
    }
    p.more = false;
    return p;
  }
};

class feed_source final : public http::body_source {
 public:
  explicit feed_source(std::shared_ptr<feed_shared> s) : s_(std::move(s)) {
    std::thread([s = s_] { s->run(); }).detach();
  }
  ~feed_source() override {
    std::lock_guard lock(s_->mu);
    s_->stop = true;
    s_->wake.notify_all();
  }
  void next(std::function<void(piece)> done) override {
    std::lock_guard lock(s_->mu);
    s_->pending = std::move(done);
    s_->wake.notify_all();
  }

 private:
  std::shared_ptr<feed_shared> s_;
};

// The keys of key= (repeatable) and keys= (comma-separated), decoded.
param<std::vector<std::string>> selected_keys(const state& st, const call& c, query::key_format fmt) {
  std::vector<std::string> texts;
  for (auto [it, end] = c.r().query.equal_range("key"); it != end; ++it) texts.push_back(it->second);
  for (auto [it, end] = c.r().query.equal_range("keys"); it != end; ++it) {
    std::string_view s = it->second;
    while (true) {
      auto comma = s.find(',');
      texts.emplace_back(s.substr(0, comma));
      if (comma == std::string_view::npos) break;
      s.remove_prefix(comma + 1);
    }
  }
  if (texts.size() > st.ctx.limits.max_batch_keys)
    return problem(
        failure_reason::bad_request,
        "at most " + std::to_string(st.ctx.limits.max_batch_keys) + " keys per subscription (query.max_batch_keys)",
        c.path());
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto k = decode_key(st, c, fmt, texts[i], "keys[" + std::to_string(i) + "]");
    if (!k.ok()) return std::move(k).error();
    if (seen.insert(*k).second) out.push_back(std::move(*k));
  }
  return out;
}

}  // namespace

outcome changes(const state& st, const call& c) {
  auto view = store_of(st, c);
  if (!view.ok()) return std::move(view).error();
  const view_def& v = **view;
  if (v.kind != view_kind::table)
    return problem(failure_reason::bad_request,
                   "store '" + c.store + "' is an aggregate: change subscriptions are of table views", c.path());
  feed_media m = feed_media::sse;
  if (auto accept = c.r().header("accept")) {
    if (accept->find("text/event-stream") != std::string::npos) m = feed_media::sse;
    else if (accept->find("application/x-ndjson") != std::string::npos) m = feed_media::ndjson;
    else if (accept->find("*/*") == std::string::npos && accept->find("text/*") == std::string::npos)
      return problem(failure_reason::not_acceptable, "this route answers text/event-stream or application/x-ndjson",
                     c.path());
  }
  if (!st.ctx.open_feed) return problem(failure_reason::shutting_down, "this instance reads no changes", c.path());

  // What to follow.
  auto fmt = key_format_of(c, v);
  if (!fmt.ok()) return std::move(fmt).error();
  ingest::feed_selection sel;
  auto keys = selected_keys(st, c, *fmt);
  if (!keys.ok()) return std::move(keys).error();
  sel.keys = std::move(*keys);
  for (auto [name, field] : {std::pair{"prefix", &sel.prefix}, std::pair{"from", &sel.from}, std::pair{"to", &sel.to}})
    if (auto text = c.r().param(name)) {
      if (!sel.keys.empty())
        return problem(failure_reason::bad_request, "key or keys cannot be combined with prefix, from or to", c.path());
      auto k = decode_key(st, c, *fmt, *text, name);
      if (!k.ok()) return std::move(k).error();
      *field = std::move(*k);
    }
  const int32_t count = st.ctx.ownership->partition_count(v.topic);
  if (count <= 0)
    return problem(failure_reason::not_caught_up, "partition count of '" + v.topic + "' not known yet", c.path());
  std::set<int32_t> parts;
  if (sel.keys.empty()) {
    for (int32_t p = 0; p < count; ++p) parts.insert(p);
  } else {
    for (const auto& k : sel.keys)
      if (auto loc = st.ctx.queries->locate(c.store, k)) parts.insert(loc->second);
  }

  // From where: a position given (every partition followed must be in it), else the
  // end of each partition now.
  std::map<int32_t, std::optional<int64_t>> start;
  for (int32_t p : parts) start[p] = std::nullopt;
  auto resume = c.r().param("from_position");
  if (!resume) resume = c.r().header("last-event-id");
  if (resume) {
    auto pos = parse_position(*resume);
    if (!pos)
      return problem(failure_reason::bad_position,
                     "from_position (or Last-Event-ID) must be partition:offset pairs, e.g. 0:42,3:7", c.path());
    for (int32_t p : parts) {
      auto at = pos->at(p);
      if (!at)
        return problem(
            failure_reason::bad_position,
            "from_position names no offset for partition " + std::to_string(p) + ", which this subscription follows",
            c.path());
      start[p] = *at;
    }
  }

  // A subscription slot, held by its thread until the stream ends.
  if (!st.feeds->enter(st.ctx.limits.max_subscriptions))
    return problem(failure_reason::subscription_capacity,
                   "too many change subscriptions are open (query.max_subscriptions); retry shortly", c.path());
  // Opening reads the topic's offsets from the broker: on a worker, not an I/O thread.
  return local_plan{{}, false, [&st, c, v = &v, sel = std::move(sel), start = std::move(start), m]() mutable {
                      auto opened = st.ctx.open_feed(*v, start);
                      if (!opened.ok()) {
                        st.feeds->leave();
                        const auto& e = opened.error();
                        if (e.code() == status_code::not_found)
                          return problem(failure_reason::history_gone,
                                         e.message() +
                                             "; read the current values (with their position) and follow "
                                             "from that position",
                                         c.path());
                        if (e.code() == status_code::invalid_argument)
                          return problem(failure_reason::bad_position, e.message(), c.path());
                        return problem(failure_reason::not_caught_up, e.message(), c.path());
                      }
                      auto shared = std::make_shared<feed_shared>();
                      shared->feed = std::move(opened.value());
                      shared->sel = std::move(sel);
                      shared->view = *v;
                      shared->media = m;
                      shared->heartbeat = st.ctx.limits.feed_heartbeat;
                      shared->threads = st.feeds;
                      shared->draining = st.ctx.draining;
                      http::response r;
                      r.content_type = m == feed_media::sse ? "text/event-stream" : "application/x-ndjson";
                      r.with_header("Cache-Control", "no-cache");
                      r.stream = std::make_shared<feed_source>(std::move(shared));
                      return r;
                    }};
}

}  // namespace kstate::server::api
