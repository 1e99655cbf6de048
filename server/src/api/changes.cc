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
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "api/change_snapshot.h"
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
  // snapshot=true on a table view: the snapshot's pages come first, then the feed is
  // opened (by `reopen`) where they leave off.
  std::unique_ptr<table_snapshot> table_snap;
  std::function<result<std::unique_ptr<ingest::change_feed>>(const std::map<int32_t, std::optional<int64_t>>&)> reopen;
  // snapshot=true on an aggregate view: `feed` replays its changelog from the
  // beginning, the latest update of each key (and window) is the snapshot.
  bool replay = false;
  // The most bytes of keys and values a replayed snapshot may hold.
  size_t max_snapshot_bytes = 16u << 20;
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
  std::deque<std::string> queued;                         // events made, not sent yet; thread only

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

  // An event that only says where the feed is: {"position": "0:12,1:40"}, id the same;
  // the start event also names the topic whose offsets positions count.
  void append_position_event(std::string& out, const char* type, const std::map<int32_t, int64_t>& pos) {
    const auto id = position_text(pos);
    std::string data = "{\"position\":";
    append_json_string(data, id);
    if (std::string_view(type) == "start") {
      data += ",\"topic\":";
      append_json_string(data, ingest::feed_topic(view));
    }
    data += '}';
    append_event(out, media, type, id, data);
  }

  // The stream's last piece: an error event (history_gone, feed_failed,
  // snapshot_failed, snapshot_too_large) at `pos`.
  http::body_source::piece error_piece(const char* error, const std::string& detail,
                                       const std::map<int32_t, int64_t>& pos) {
    http::body_source::piece p;
    std::string data = "{\"error\":";
    append_json_string(data, error);
    data += ",\"detail\":";
    append_json_string(data, detail);
    data += '}';
    append_event(p.data, media, "error", position_text(pos), data);
    ended = true;
    p.more = false;
    return p;
  }

  // Queued events, up to a piece's size (at least one).
  http::body_source::piece drain() {
    http::body_source::piece p;
    p.more = true;
    while (!queued.empty() && (p.data.empty() || p.data.size() + queued.front().size() <= max_piece_bytes)) {
      p.data += queued.front();
      queued.pop_front();
    }
    return p;
  }

  // A snapshot event: one current entry. Its SSE id is empty, which clears the
  // client's last event id: a reconnection during the snapshot starts it again.
  void queue_snapshot_event(std::string_view data) {
    std::string e;
    append_event(e, media, "snapshot", "", data);
    queued.push_back(std::move(e));
  }

  // The next page of a table's snapshot, as snapshot events; once the last page is
  // read, opens the feed where the pages leave off and queues the start event. An
  // error ends the stream.
  std::optional<http::body_source::piece> next_table_page() {
    std::vector<std::string> entries;
    auto more = table_snap->next(entries);
    if (!more.ok()) return error_piece("snapshot_failed", more.error().message(), {});
    for (const auto& e : entries) queue_snapshot_event(e);
    if (*more) return std::nullopt;
    const auto from = table_snap->follow_from();
    std::map<int32_t, std::optional<int64_t>> start;
    for (const auto& [p, next] : from) start[p] = next;
    auto opened = reopen(start);
    if (!opened.ok()) {
      const bool gone = opened.error().code() == status_code::not_found;
      return error_piece(gone ? "history_gone" : "feed_failed", opened.error().message(), from);
    }
    feed = std::move(opened.value());
    std::string e;
    append_position_event(e, "start", feed->position());
    queued.push_back(std::move(e));
    return std::nullopt;
  }

  // An aggregate's snapshot: replays the changelog to the end of each partition,
  // keeping the latest update of each key (and window) of the selection, then queues
  // them (windows expired at the partition's stream time left out), the start event,
  // and the changes read past a partition's end meanwhile. An error ends the stream.
  std::optional<http::body_source::piece> run_replay() {
    struct held {
      ingest::feed_change change;
      size_t bytes;
    };
    std::map<std::pair<std::string, int64_t>, held> latest;  // (key, window start)
    std::vector<ingest::feed_change> after;                  // past a partition's end
    std::map<int32_t, int64_t> at_end;                       // the snapshot's position
    size_t bytes = 0;
    const size_t followed = feed->position().size();
    while (feed->caught_up().size() < followed) {
      if (stopping()) {
        ended = true;
        http::body_source::piece p;
        p.more = false;
        return p;
      }
      const auto before = feed->caught_up();
      auto changes = feed->poll(sel, std::chrono::milliseconds(200), 10'000, max_piece_bytes);
      if (!changes.ok()) {
        const bool gone = changes.error().code() == status_code::not_found;
        return error_piece(gone ? "history_gone" : "feed_failed", changes.error().message(), feed->position());
      }
      for (auto& c : *changes) {
        const size_t size = c.key.size() + (c.value ? c.value->size() : 0) + 64;
        if (before.count(c.partition)) {
          bytes += size;
          after.push_back(std::move(c));
          continue;
        }
        std::pair<std::string, int64_t> id{c.key, c.window_start.value_or(0)};
        auto it = latest.find(id);
        if (it != latest.end()) {
          bytes -= it->second.bytes;
          latest.erase(it);
        }
        if (!c.value) continue;
        bytes += size;
        latest.emplace(std::move(id), held{std::move(c), size});
      }
      for (int32_t p : feed->caught_up())
        if (!before.count(p)) at_end[p] = feed->position().at(p);
      if (bytes > max_snapshot_bytes)
        return error_piece("snapshot_too_large",
                           "the snapshot of this selection holds more than " + std::to_string(max_snapshot_bytes) +
                               " bytes (query.max_response_bytes); select fewer keys",
                           {});
    }
    const auto snapshot_id = position_text(at_end);
    const auto& stream_time = feed->max_timestamps();
    for (const auto& [id, h] : latest) {
      if (view.window && h.change.window_start) {
        auto st = stream_time.find(h.change.partition);
        const bool expired =
            st != stream_time.end() &&
            (is_session(*view.window)
                 ? session_expired(*view.window, h.change.session_last.value_or(*h.change.window_start), st->second)
                 : window_expired(*view.window, *h.change.window_start, st->second));
        if (expired) continue;
      }
      queue_snapshot_event(change_data(h.change, snapshot_id));
    }
    std::string e;
    append_position_event(e, "start", at_end);
    queued.push_back(std::move(e));
    auto running = at_end;
    for (const auto& c : after) {
      running[c.partition] = c.offset + 1;
      const auto id = position_text(running);
      std::string ev;
      append_event(ev, media, "change", id, change_data(c, id));
      queued.push_back(std::move(ev));
    }
    return std::nullopt;
  }

  // A change event's data: {"deleted","key","offset","partition","position",
  // "timestamp","value"}, with "changelog_offset" for aggregates and the window's
  // "start", "end" (and their times) for windowed views.
  std::string change_data(const ingest::feed_change& c, const std::string& id) const {
    std::string data = "{";
    if (view.is_aggregate()) {
      data += "\"changelog_offset\":";
      append_int(data, c.offset);
      data += ',';
    }
    data += "\"deleted\":";
    data += c.value ? "false" : "true";
    if (c.window_start && view.window && (!is_session(*view.window) || c.session_last)) {
      // Half-open, as answers give windows: a session ends 1 ms after its last record.
      const int64_t end = is_session(*view.window) ? *c.session_last + 1 : *c.window_start + view.window->size_ms;
      data += ",\"end\":";
      append_int(data, end);
      data += ",\"end_time\":";
      append_json_string(data, format_timestamp_ms(end));
    }
    data += ",\"key\":";
    append_rendered_key(data, view.key_format, c.key);
    data += ",\"offset\":";
    append_int(data, view.is_aggregate() ? c.source_offset : c.offset);
    data += ",\"partition\":";
    append_int(data, c.partition);
    data += ",\"position\":";
    append_json_string(data, id);
    if (c.window_start) {
      data += ",\"start\":";
      append_int(data, *c.window_start);
      data += ",\"start_time\":";
      append_json_string(data, format_timestamp_ms(*c.window_start));
    }
    data += ",\"timestamp\":";
    append_int(data, c.timestamp);
    data += ",\"value\":";
    // Aggregates are JSON whatever their source's value format.
    if (c.value) append_rendered_value(data, view.is_aggregate() ? data_format::json : view.value_format, *c.value);
    else data += "null";
    data += '}';
    return data;
  }

  http::body_source::piece make_piece() {
    http::body_source::piece p;
    p.more = true;
    if (ended) {
      p.more = false;
      return p;
    }
    if (!queued.empty()) return drain();
    if (!started) {
      started = true;
      if (replay) {
        if (auto failed = run_replay()) return std::move(*failed);
        return drain();
      }
      if (!table_snap) {
        // Where the stream begins: resuming from this id misses nothing.
        append_position_event(p.data, "start", feed->position());
        return p;
      }
    }
    while (!feed) {  // a table's snapshot, page by page
      if (stopping()) {
        p.more = false;
        return p;
      }
      if (auto failed = next_table_page()) return std::move(*failed);
      if (!queued.empty()) return drain();
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
        return error_piece(gone ? "history_gone" : "feed_failed", changes.error().message(), running);
      }
      for (const auto& c : *changes) {
        running[c.partition] = c.offset + 1;
        // Already in the snapshot the stream began with.
        if (table_snap && table_snap->reflected(c.partition, c.offset, c.key)) continue;
        const auto id = position_text(running);
        append_event(p.data, media, "change", id, change_data(c, id));
      }
      if (!p.data.empty()) return p;
      if (std::chrono::steady_clock::now() >= due) {
        // Nothing of the selection for a while: where the feed is now (every record
        // before it read), so that a resumption need not read them again, and so that
        // proxies see traffic.
        append_position_event(p.data, "position", feed->position());
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
    auto k = decode_key(st, c, fmt, texts[i], "keys", i);
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

  // snapshot=true: the current entries first, then the changes after them; with a
  // position to resume from, only when its history is gone.
  bool snapshot = false;
  if (auto text = c.r().param("snapshot")) {
    if (*text != "true" && *text != "false")
      return problem(failure_reason::bad_request, "snapshot must be true or false", c.path());
    snapshot = *text == "true";
  }

  // From where: a position given (every partition followed must be in it), else the
  // end of each partition now.
  std::map<int32_t, std::optional<int64_t>> start;
  for (int32_t p : parts) start[p] = std::nullopt;
  auto resume = c.r().param("from_position");
  if (!resume) resume = c.r().header("last-event-id");
  // An SSE client reconnecting during a snapshot sends the empty id its events carry.
  if (snapshot && resume.value_or("x").empty()) resume = std::nullopt;
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
  const bool resuming = resume.has_value();
  return local_plan{
      {}, false, [&st, c, v = &v, sel = std::move(sel), start = std::move(start), m, snapshot, resuming]() mutable {
        auto refuse = [&](const status& e) {
          st.feeds->leave();
          if (e.code() == status_code::not_found)
            return problem(failure_reason::history_gone,
                           e.message() +
                               "; subscribe with snapshot=true, or read the current values (with "
                               "their position) and follow from that position",
                           c.path());
          if (e.code() == status_code::invalid_argument)
            return problem(failure_reason::bad_position, e.message(), c.path());
          return problem(failure_reason::not_caught_up, e.message(), c.path());
        };
        auto shared = std::make_shared<feed_shared>();
        bool from_snapshot = snapshot && !resuming;
        if (!from_snapshot) {
          auto opened = st.ctx.open_feed(*v, start, {});
          if (opened.ok()) shared->feed = std::move(opened.value());
          else if (snapshot && opened.error().code() == status_code::not_found) from_snapshot = true;
          else return refuse(opened.error());
        }
        if (from_snapshot && v->is_aggregate()) {
          // The changelog is compacted: replayed from its beginning, it
          // holds the latest update of every key.
          auto opened = st.ctx.open_feed(*v, start, {.from_beginning = true, .report_end = true});
          if (!opened.ok()) return refuse(opened.error());
          shared->feed = std::move(opened.value());
          shared->replay = true;
          shared->max_snapshot_bytes = st.ctx.limits.max_response_bytes;
        } else if (from_snapshot) {
          auto auth = c.r().header("authorization");
          shared->table_snap = std::make_unique<table_snapshot>(
              st.self, c.store, sel, auth ? std::string(*auth) : std::string(), st.ctx.limits.max_limit);
          shared->reopen = [open = st.ctx.open_feed, view = *v](const auto& from) { return open(view, from, {}); };
        }
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
