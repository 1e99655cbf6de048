// Handlers of many keys: range and prefix pages, NDJSON scans, pages of windows across
// keys, and counts. Each reads the partitions held here and, when others own some of
// the store's partitions, asks them for their parts and merges.

#include <algorithm>
#include <atomic>
#include <mutex>

#include "api/fanout.h"
#include "api/handlers.h"
#include "api/params.h"
#include "api/placement.h"
#include "api/render.h"
#include "http/url.h"
#include "query/cursor.h"
#include "server/json_render.h"
#include "server/problem.h"

namespace kstate::server::api {
namespace {

// A page or a scan of keys (or of windows) as the request asked for it.
struct range_request {
  const view_def* view = nullptr;
  query::range_query q;  // store, bounds, order, `after` from the cursor
  uint32_t limit = 0;
  std::string fingerprint;  // what a cursor of this query is made for
  // Windows of a windowed store: the event-time interval [from, to), ms.
  std::optional<std::pair<int64_t, int64_t>> windows;
  std::vector<int32_t> partitions;  // every partition of the topic, or a peer's part
  // allow_stale=true (pages of keys): partitions whose owner cannot answer are read
  // from copies, and the page says it is stale.
  bool allow_stale = false;
};

// One entry of a page: its stored key (the merge order and the cursor) and its JSON.
struct page_entry {
  std::string stored_key;
  std::string json;
};
struct local_page {
  std::vector<page_entry> entries;
  bool more = false;
  position pos;
  bool stale = false;  // some partition read from a copy
};

// A page of at most `limit` entries of the partitions `parts` (all held here), in
// stored key order, ending early (with `more`) before `max_bytes` of JSON.
query::query_result<local_page> read_page(const state& st, const range_request& rr, const std::vector<int32_t>& parts,
                                          uint32_t limit) {
  using R = query::query_result<local_page>;
  auto q = rr.q;
  q.partitions = parts;
  q.from_copies = rr.allow_stale;
  local_page page;
  std::size_t bytes = 0;
  const std::size_t max_bytes = st.ctx.limits.max_response_bytes;
  // Adds an entry unless the page is full; false once it is.
  auto add = [&](std::string stored_key, std::string json) {
    if (!page.entries.empty() && bytes + json.size() > max_bytes) {
      page.more = true;
      return false;
    }
    bytes += json.size() + 1;
    page.entries.push_back(page_entry{std::move(stored_key), std::move(json)});
    return true;
  };
  if (rr.windows) {
    auto res = st.ctx.queries->window_range({q, rr.windows->first, rr.windows->second}, limit);
    if (!res.ok()) return R::fail(res.failure(), res.message());
    auto& a = res.answer();
    page.entries.reserve(a.entries.size());
    for (auto& e : a.entries) {
      std::string json;
      std::string_view key = e.key;
      append_window(json, *rr.view, &key, e.window.start, e.window.end, e.window.value, e.window.offset, e.partition);
      if (!add(std::move(e.stored_key), std::move(json))) break;
    }
    page.more = page.more || a.more;
    page.pos = std::move(a.pos);
    return R::success(std::move(page));
  }
  auto res = st.ctx.queries->range(q, limit);
  if (!res.ok()) return R::fail(res.failure(), res.message());
  auto& a = res.answer();
  page.entries.reserve(a.entries.size());
  for (auto& e : a.entries) {
    std::string json;
    // The members' names and numbers (about 60 bytes), the key and the value, each
    // plain text of about its stored size: one allocation instead of a growth per member.
    json.reserve(64 + e.key.size() + e.value.size());
    append_entry(json, *rr.view, e.key, e.value, e.partition, e.offset);
    if (!add(std::move(e.key), std::move(json))) break;
  }
  page.more = page.more || a.more;
  page.pos = std::move(a.pos);
  page.stale = a.stale;
  return R::success(std::move(page));
}

// The part framing of a page, for the instance that merges.
std::string page_part(const local_page& page) {
  nlohmann::json header{{"more", page.more}, {"position", position_json(page.pos)}};
  if (page.stale) header["stale"] = true;
  part_writer w(header);
  for (const auto& e : page.entries) w.add(e.stored_key, e.json);
  return w.take();
}

// The answer's page: entries in order, the cursor of the last one when there is more,
// the Link header to the next page (the same parameters plus the cursor).
http::response page_response(const state& st, const call& c, const range_request& rr,
                             const std::vector<std::string_view>& entries, std::string_view last_key, bool more,
                             const position& pos, bool stale) {
  std::optional<std::string> next;
  std::string link;
  if (more && !entries.empty()) {
    next = query::encode_cursor({std::string(last_key)}, rr.fingerprint);
    std::string target = c.path() + "?";
    bool first = true;
    for (const auto& [k, v] : c.r().query) {
      if (k == "cursor") continue;
      target += (first ? "" : "&") + http::percent_encode(k) + "=" + http::percent_encode(v);
      first = false;
    }
    target += (first ? "" : "&") + std::string("cursor=") + *next;
    link = "<" + target + ">; rel=\"next\"";
  }
  http::response r;
  r.body = page_body(entries, next, pos, st.ctx.instance, stale);
  r.with_header("X-Kstate-Position", position_header(pos));
  if (stale) r.with_header("X-Kstate-Stale", "true");
  if (!link.empty()) r.with_header("Link", link);
  return r;
}

// Merges parts (each in stored key order) into one page of at most `limit` entries.
http::response merge_pages(const state& st, const call& c, const range_request& rr,
                           const std::vector<std::string>& parts) {
  std::vector<part_entry> all;
  bool more = false, stale = false;
  position pos;
  for (const auto& p : parts) {
    auto pv = read_part(p);
    if (!pv) return problem(failure_reason::internal, "an owner's part of the page is malformed", c.path());
    more = more || pv->header.value("more", false);
    stale = stale || pv->header.value("stale", false);
    pos.merge(pv->pos);
    all.insert(all.end(), pv->entries.begin(), pv->entries.end());
  }
  const bool desc = rr.q.descending;
  std::sort(all.begin(), all.end(), [desc](const part_entry& a, const part_entry& b) {
    return desc ? b.stored_key < a.stored_key : a.stored_key < b.stored_key;
  });
  std::vector<std::string_view> entries;
  std::size_t bytes = 0;
  for (const auto& e : all) {
    if (entries.size() == rr.limit ||
        (!entries.empty() && bytes + e.entry_json.size() > st.ctx.limits.max_response_bytes)) {
      more = true;
      break;
    }
    bytes += e.entry_json.size() + 1;
    entries.push_back(e.entry_json);
  }
  std::string_view last = entries.empty() ? std::string_view() : all[entries.size() - 1].stored_key;
  return page_response(st, c, rr, entries, last, more, pos, stale);
}

// The target asking an owner for its partitions' part of `rr`: the client's parameters
// (bounds, order, key format, interval) without cursor and limit, plus the limit, the
// partitions, where to resume, and the caller's min_position for those partitions.
peer_part page_part_request(const call& c, const range_request& rr, const std::string& endpoint,
                            const std::vector<int32_t>& parts, uint32_t limit) {
  peer_part part;
  part.endpoint = endpoint;
  std::string target = c.path() + "?";
  for (const auto& [k, v] : c.r().query)
    if (k != "cursor" && k != "limit" && k != "min_position" && k != "timeout_ms")
      target += http::percent_encode(k) + "=" + http::percent_encode(v) + "&";
  target += "limit=" + std::to_string(limit) + "&partitions=" + partition_list(parts);
  if (rr.q.after) target += "&after=" + query::base64url_encode(*rr.q.after);
  target += wait_params(c, parts, part.wait);
  part.target = std::move(target);
  return part;
}

// Parses what range and windows_range share: the store, the key format, the cursor, a
// peer's partitions and `after`. `bounds` names the key bounds' parameters.
param<range_request> range_request_of(const state& st, const call& c, bool windowed_route) {
  auto view = store_of(st, c);
  if (!view.ok()) return std::move(view).error();
  const view_def& v = **view;
  range_request rr;
  rr.view = &v;
  rr.q.store = c.store;
  auto fmt = key_format_of(c, v);
  if (!fmt.ok()) return std::move(fmt).error();
  const auto names = windowed_route
                         ? std::vector<std::pair<const char*, std::optional<std::string>*>>{{"key_from", &rr.q.from},
                                                                                            {"key_to", &rr.q.to}}
                         : std::vector<std::pair<const char*, std::optional<std::string>*>>{
                               {"from", &rr.q.from}, {"to", &rr.q.to}, {"prefix", &rr.q.prefix}};
  for (auto [name, field] : names) {
    if (auto text = c.r().param(name)) {
      auto k = decode_key(st, c, *fmt, *text, name);
      if (!k.ok()) return std::move(k).error();
      *field = std::move(*k);
    }
  }
  if (windowed_route) {
    auto interval = interval_of(c);
    if (!interval.ok()) return std::move(interval).error();
    rr.windows = *interval;
    // Distinct from every key range fingerprint: a keys cursor is refused here.
    rr.fingerprint = c.store + '\0' + "windows" + '\0';
    fingerprint_add(rr.fingerprint, rr.q.from);
    fingerprint_add(rr.fingerprint, rr.q.to);
    rr.fingerprint += std::to_string(interval->first) + ':' + std::to_string(interval->second);
  } else {
    auto desc = descending_of(c);
    if (!desc.ok()) return std::move(desc).error();
    rr.q.descending = *desc;
    rr.fingerprint = keys_fingerprint(c.store, *desc, rr.q.from, rr.q.to, rr.q.prefix);
    auto as_of = as_of_of(c, v);
    if (!as_of.ok()) return std::move(as_of).error();
    rr.q.as_of = *as_of;
    // Bound into the cursor: a page cannot continue at another time than it began.
    if (rr.q.as_of) rr.fingerprint += "as_of=" + std::to_string(*rr.q.as_of);
  }
  auto limit = limit_of(st, c);
  if (!limit.ok()) return std::move(limit).error();
  rr.limit = *limit;
  if (auto cur = c.r().param("cursor")) {
    auto decoded = query::decode_cursor(*cur, rr.fingerprint);
    if (!decoded.ok()) return problem(failure_reason::bad_cursor, decoded.error().message(), c.path());
    rr.q.after = decoded->last_key;
  }
  auto all = all_partitions(st, c, v);
  if (!all.ok()) return std::move(all).error();
  rr.partitions = std::move(*all);
  // A peer's part: only these partitions, strictly after `after`.
  auto parts = partitions_of(c, static_cast<int32_t>(rr.partitions.size()));
  if (!parts.ok()) return std::move(parts).error();
  if (*parts) rr.partitions = std::move(**parts);
  auto after = after_of(c);
  if (!after.ok()) return std::move(after).error();
  if (*after) rr.q.after = std::move(**after);
  rr.allow_stale = !windowed_route && c.r().param("allow_stale") == "true";
  return rr;
}

// Where each partition of an allow_stale page is read from: this instance (held
// current, or its copy), the owner (then this instance's copy, then other instances'
// copies), or, with no owner to ask and no copy here, other instances' copies.
struct stale_placement {
  std::vector<int32_t> local;
  std::map<std::string, std::vector<int32_t>> remote;
  std::vector<int32_t> elsewhere;
};
stale_placement place_stale(const state& st, const call& c, const range_request& rr) {
  stale_placement out;
  const auto& topic = rr.view->topic;
  for (int32_t p : rr.partitions) {
    // A peer asked for this part: answered here, current or from the copy, or refused.
    if (c.from_peer) {
      out.local.push_back(p);
      continue;
    }
    auto ps = st.ctx.ownership->partition(topic, p);
    const bool here = ps && ps->assigned && (ps->ready || st.ctx.queries->has_copy(c.store, p));
    if (here) {
      out.local.push_back(p);
    } else if (ps && ps->assigned) {
      out.elsewhere.push_back(p);  // catching up, nothing of it here yet (a new instance)
    } else if (auto owner = owner_of(st, topic, p)) {
      out.remote[*owner].push_back(p);
    } else if (st.ctx.queries->has_copy(c.store, p)) {
      out.local.push_back(p);
    } else {
      out.elsewhere.push_back(p);
    }
  }
  return out;
}

// The instances that may keep a copy of some of `parts` (standbys of each first),
// `owner` excluded.
std::vector<std::string> copies_of(const state& st, const std::string& topic, const std::vector<int32_t>& parts,
                                   const std::optional<std::string>& owner) {
  std::vector<std::string> out;
  for (int32_t p : parts)
    for (auto& e : copy_holders(st, topic, p, owner))
      if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(std::move(e));
  return out;
}

// A page (or a peer's part of one), local or gathered. `cheap`: a page of keys is
// bounded by its limit; a page of windows may skip many stored windows: a worker's job.
outcome page_outcome(const state& st, const call& c, const std::shared_ptr<const range_request>& rr, media m,
                     bool cheap) {
  auto where = rr->allow_stale ? param<placement>(placement{}) : place(st, c, *rr->view, rr->partitions);
  if (!where.ok()) return std::move(where).error();
  std::vector<peer_part> from_copies;  // allow_stale: parts no owner can give
  if (rr->allow_stale) {
    auto sp = place_stale(st, c, *rr);
    where->local = std::move(sp.local);
    for (auto& [owner, parts] : sp.remote) {
      auto part = page_part_request(c, *rr, owner, parts, rr->limit);
      part.copies = copies_of(st, rr->view->topic, parts, owner);
      bool copies_here = true;
      for (int32_t p : parts) copies_here = copies_here && st.ctx.queries->has_copy(c.store, p);
      if (copies_here)
        part.local_copy = [&st, rr, parts]() -> std::optional<std::string> {
          auto page = read_page(st, *rr, parts, rr->limit);
          if (!page.ok()) return std::nullopt;
          return page_part(page.answer());
        };
      from_copies.push_back(std::move(part));
    }
    if (!sp.elsewhere.empty()) {
      auto holders = copies_of(st, rr->view->topic, sp.elsewhere, std::nullopt);
      if (holders.empty())
        return problem(failure_reason::not_owner,
                       "partition " + std::to_string(sp.elsewhere.front()) + " of '" + rr->view->topic +
                           "' has no owner that can answer yet and no copy of it is known",
                       c.path());
      auto part = page_part_request(c, *rr, holders.front(), sp.elsewhere, rr->limit);
      part.copies.assign(holders.begin() + 1, holders.end());
      from_copies.push_back(std::move(part));
    }
  }
  if (m == media::part) {
    return local_plan{bound_for(c, where->local), cheap, [&st, c, rr, local = where->local] {
                        auto page = read_page(st, *rr, local, rr->limit);
                        if (!page.ok()) return from_failure(page.failure(), page.message(), c.path());
                        http::response r;
                        r.content_type = std::string(part_media_type);
                        r.body = page_part(page.answer());
                        return r;
                      }};
  }
  if (where->remote.empty() && from_copies.empty()) {
    return local_plan{bound_for(c, where->local), cheap, [&st, c, rr, local = where->local] {
                        auto page = read_page(st, *rr, local, rr->limit);
                        if (!page.ok()) return from_failure(page.failure(), page.message(), c.path());
                        const auto& a = page.answer();
                        std::vector<std::string_view> entries;
                        entries.reserve(a.entries.size());
                        for (const auto& e : a.entries) entries.push_back(e.json);
                        std::string_view last = a.entries.empty() ? std::string_view() : a.entries.back().stored_key;
                        return page_response(st, c, *rr, entries, last, a.more, a.pos, a.stale);
                      }};
  }
  // Partitions held here are read on a worker; every other owner is asked once, in
  // parallel, for up to `limit` entries of its partitions after the same key.
  gather_plan g;
  if (!where->local.empty()) {
    g.local_bound = bound_for(c, where->local);
    g.local = [&st, c, rr, local = where->local]() -> part_result {
      auto page = read_page(st, *rr, local, rr->limit);
      if (!page.ok()) return from_failure(page.failure(), page.message(), c.path());
      return page_part(page.answer());
    };
  }
  for (const auto& [endpoint, parts] : where->remote)
    g.remote.push_back(page_part_request(c, *rr, endpoint, parts, rr->limit));
  for (auto& part : from_copies) g.remote.push_back(std::move(part));
  g.merge = [&st, c, rr](const std::vector<std::string>& parts) { return merge_pages(st, c, *rr, parts); };
  return g;
}

// --- NDJSON scans ---------------------------------------------------------------------

// One of the query.max_concurrent_scans slots, held by a scan while it is alive.
class scan_slot {
 public:
  static std::shared_ptr<scan_slot> take(const state& st) {
    auto& open = st.open_scans;
    if (open.fetch_add(1) >= st.ctx.limits.max_concurrent_scans) {
      --open;
      return nullptr;
    }
    return std::shared_ptr<scan_slot>(new scan_slot(open));
  }
  ~scan_slot() { --open_; }

 private:
  explicit scan_slot(std::atomic<uint32_t>& open) : open_(open) {}
  std::atomic<uint32_t>& open_;
};

// Entries in one piece of a scan (each bounded by Kafka's record size).
constexpr std::size_t scan_piece_entries = 256;

// A scan of partitions all held here: pieces read from one snapshot on a worker thread.
class local_scan_source final : public http::body_source {
 public:
  local_scan_source(std::shared_ptr<const state> st, std::unique_ptr<query::range_stream> s, const view_def& v,
                    std::shared_ptr<scan_slot> slot)
      : st_(std::move(st)), stream_(std::move(s)), view_(v), slot_(std::move(slot)) {}

  void next(std::function<void(piece)> done) override {
    // The stream is used by one task at a time: the server asks for the next piece only
    // after this one was written.
    auto task = [this, done] { done(make_piece()); };
    if (!st_->workers->post(task)) done(piece{{}, false, true});
  }

 private:
  piece make_piece() {
    piece p;
    batch_.clear();
    p.more = stream_->next(batch_, scan_piece_entries);
    if (!stream_->error().ok()) return piece{{}, false, true};
    for (const auto& e : batch_) {
      append_entry(p.data, view_, e.key, e.value, e.partition, e.offset);
      p.data += '\n';
    }
    return p;
  }

  std::shared_ptr<const state> st_;
  std::unique_ptr<query::range_stream> stream_;
  const view_def& view_;
  std::shared_ptr<scan_slot> slot_;
  std::vector<query::range_entry> batch_;
};

// A scan of partitions some of which other instances own: pieces of up to 256 entries,
// each gathered from every owner (the partitions held here read on a worker, one
// request per other owner) and merged, asked for only once the previous piece is on
// the wire. An owner that fails ends the stream early (the client sees it truncated,
// without the final chunk).
class cluster_scan_source final : public http::body_source, public std::enable_shared_from_this<cluster_scan_source> {
 public:
  cluster_scan_source(std::shared_ptr<const state> st, call c, range_request rr, placement where,
                      std::shared_ptr<scan_slot> slot)
      : st_(std::move(st)), c_(std::move(c)), rr_(std::move(rr)), where_(std::move(where)), slot_(std::move(slot)) {}

  void next(std::function<void(piece)> done) override {
    struct round {
      std::mutex mu;
      std::size_t pending = 0;
      std::vector<std::string> parts;
      bool failed = false;
    };
    auto r = std::make_shared<round>();
    r->pending = where_.remote.size() + (where_.local.empty() ? 0 : 1);
    auto self = shared_from_this();
    auto arrived = [self, r, done](part_result p) {
      bool last;
      {
        std::lock_guard lock(r->mu);
        if (auto* body = std::get_if<std::string>(&p)) r->parts.push_back(std::move(*body));
        else r->failed = true;
        last = --r->pending == 0;
      }
      if (!last) return;
      if (r->failed) return done(piece{{}, false, true});
      done(self->merge(r->parts));
    };
    // Only the first page waits for the caller's min_position.
    const bool first = first_;
    first_ = false;
    call c = c_;
    if (!first) c.min_position.reset();
    for (const auto& [endpoint, parts] : where_.remote)
      send_part(*st_, c, page_part_request(c, rr_, endpoint, parts, scan_piece_entries), arrived);
    if (!where_.local.empty()) {
      if (!st_->workers->post([self, arrived] {
            auto page = read_page(*self->st_, self->rr_, self->where_.local, scan_piece_entries);
            if (!page.ok()) return arrived(http::response{});
            arrived(page_part(page.answer()));
          }))
        arrived(http::response{});
    }
  }

 private:
  piece merge(const std::vector<std::string>& parts) {
    std::vector<part_entry> all;
    bool more = false;
    for (const auto& p : parts) {
      auto pv = read_part(p);
      if (!pv) return piece{{}, false, true};
      more = more || pv->header.value("more", false);
      all.insert(all.end(), pv->entries.begin(), pv->entries.end());
    }
    std::sort(all.begin(), all.end(),
              [](const part_entry& a, const part_entry& b) { return a.stored_key < b.stored_key; });
    if (all.size() > scan_piece_entries) {
      all.resize(scan_piece_entries);
      more = true;
    }
    piece out;
    for (const auto& e : all) {
      out.data.append(e.entry_json.data(), e.entry_json.size());
      out.data += '\n';
    }
    if (!all.empty()) rr_.q.after = std::string(all.back().stored_key);
    out.more = more && !all.empty();
    return out;
  }

  std::shared_ptr<const state> st_;
  call c_;
  range_request rr_;
  placement where_;
  std::shared_ptr<scan_slot> slot_;
  bool first_ = true;
};

outcome cluster_scan(const state& st, const call& c, const std::shared_ptr<const range_request>& rr,
                     const placement& where, const std::shared_ptr<scan_slot>& slot) {
  // The partitions held here reach the caller's min_position before the stream starts;
  // the other owners wait for theirs when asked for the first piece.
  return local_plan{bound_for(c, where.local), true, [&st, c, rr, where, slot] {
                      http::response r;
                      r.content_type = "application/x-ndjson";
                      r.stream = std::make_shared<cluster_scan_source>(st.shared_from_this(), c, *rr, where, slot);
                      return r;
                    }};
}

// --- counts -------------------------------------------------------------------------

// The count of the partitions `parts` (all held here), as a part.
part_result count_part(const state& st, const call& c, const std::vector<int32_t>& parts,
                       std::optional<int64_t> as_of) {
  auto res = st.ctx.queries->count(c.store, st.ctx.limits.exact_count_limit, parts, as_of);
  if (!res.ok()) return from_failure(res.failure(), res.message(), c.path());
  const auto& a = res.answer();
  part_writer w(nlohmann::json{{"count", a.count}, {"exact", a.exact}, {"position", position_json(a.pos)}});
  return w.take();
}

// {"count","exact","metadata":{"position"},"served_by","store"} from the parts.
http::response merge_counts(const state& st, const call& c, const std::vector<std::string>& parts) {
  uint64_t count = 0;
  bool exact = true;
  position pos;
  for (const auto& p : parts) {
    auto pv = read_part(p);
    if (!pv) return problem(failure_reason::internal, "an owner's count is malformed", c.path());
    count += pv->header.value("count", uint64_t{0});
    exact = exact && pv->header.value("exact", false);
    pos.merge(pv->pos);
  }
  http::response r;
  std::string& b = r.body;
  b += "{\"count\":";
  b += std::to_string(count);
  b += ",\"exact\":";
  b += exact ? "true" : "false";
  b += ",\"metadata\":{\"position\":";
  append_position(b, pos);
  b += "},\"served_by\":";
  append_json_string(b, st.ctx.instance);
  b += ",\"store\":";
  append_json_string(b, c.store);
  b += '}';
  r.with_header("X-Kstate-Position", position_header(pos));
  return r;
}

}  // namespace

outcome range(const state& st, const call& c) {
  auto rq = range_request_of(st, c, false);
  if (!rq.ok()) return std::move(rq).error();
  if (rq->view->window)
    return problem(failure_reason::bad_request,
                   "store '" + c.store + "' is windowed; read its windows at /v1/stores/" + c.store + "/windows",
                   c.path());
  const media m = negotiate(c, true);
  if (m == media::none)
    return problem(failure_reason::not_acceptable, "this route answers application/json or application/x-ndjson",
                   c.path());
  auto rr = std::make_shared<const range_request>(std::move(*rq));
  if (m != media::ndjson) return page_outcome(st, c, rr, m, true);
  if (rr->allow_stale)
    return problem(failure_reason::bad_request,
                   "allow_stale applies to pages (application/json), not to streamed scans", c.path());

  auto slot = scan_slot::take(st);
  if (!slot) return problem(failure_reason::scan_capacity, "too many scans in progress; retry shortly", c.path());
  auto where = place(st, c, *rr->view, rr->partitions);
  if (!where.ok()) return std::move(where).error();
  if (where->remote.empty()) {
    // Opened on a worker: creating the iterators reads the store. A stream may read the
    // whole store: its blocks stay out of the lookups' cache.
    return local_plan{bound_for(c, where->local), false, [&st, c, rr, slot, local = where->local] {
                        auto q = rr->q;
                        q.partitions = local;
                        auto opened = st.ctx.queries->open_range(q, storage::scan_use::sweep);
                        if (!opened.ok()) return from_failure(opened.failure(), opened.message(), c.path());
                        http::response r;
                        r.content_type = "application/x-ndjson";
                        r.with_header("X-Kstate-Position", position_header(opened.answer()->pos()));
                        r.stream = std::make_shared<local_scan_source>(st.shared_from_this(),
                                                                       std::move(opened.answer()), *rr->view, slot);
                        return r;
                      }};
  }
  return cluster_scan(st, c, rr, *where, slot);
}

outcome windows_range(const state& st, const call& c) {
  auto rq = range_request_of(st, c, true);
  if (!rq.ok()) return std::move(rq).error();
  if (!rq->view->window)
    return problem(failure_reason::bad_request,
                   "store '" + c.store + "' is not windowed; read its keys at /v1/stores/" + c.store + "/keys",
                   c.path());
  const media m = negotiate(c, false);
  if (m == media::none) return problem(failure_reason::not_acceptable, "this route answers application/json", c.path());
  // A page of windows skips the windows outside the interval: it may read far more than
  // it answers, so it runs on a worker.
  return page_outcome(st, c, std::make_shared<const range_request>(std::move(*rq)), m, false);
}

outcome count(const state& st, const call& c) {
  auto view = store_of(st, c);
  if (!view.ok()) return std::move(view).error();
  const view_def& v = **view;
  auto all = all_partitions(st, c, v);
  if (!all.ok()) return std::move(all).error();
  std::vector<int32_t> wanted = std::move(*all);
  auto parts = partitions_of(c, static_cast<int32_t>(wanted.size()));
  if (!parts.ok()) return std::move(parts).error();
  if (*parts) wanted = std::move(**parts);
  auto as_of_param = as_of_of(c, v);
  if (!as_of_param.ok()) return std::move(as_of_param).error();
  const std::optional<int64_t> as_of = *as_of_param;
  auto where = place(st, c, v, wanted);
  if (!where.ok()) return std::move(where).error();
  // An exact count scans the store: always on a worker.
  if (negotiate(c, false) == media::part) {
    return local_plan{bound_for(c, where->local), false, [&st, c, local = where->local, as_of] {
                        auto part = count_part(st, c, local, as_of);
                        if (auto* failed = std::get_if<http::response>(&part)) return std::move(*failed);
                        http::response r;
                        r.content_type = std::string(part_media_type);
                        r.body = std::move(std::get<std::string>(part));
                        return r;
                      }};
  }
  if (where->remote.empty()) {
    return local_plan{bound_for(c, where->local), false, [&st, c, local = where->local, as_of] {
                        auto part = count_part(st, c, local, as_of);
                        if (auto* failed = std::get_if<http::response>(&part)) return std::move(*failed);
                        return merge_counts(st, c, {std::get<std::string>(part)});
                      }};
  }
  gather_plan g;
  if (!where->local.empty()) {
    g.local_bound = bound_for(c, where->local);
    g.local = [&st, c, local = where->local, as_of] { return count_part(st, c, local, as_of); };
  }
  for (const auto& [endpoint, ps] : where->remote) {
    peer_part part;
    part.endpoint = endpoint;
    part.target = c.path() + "?partitions=" + partition_list(ps) +
                  (as_of ? "&as_of=" + std::to_string(*as_of) : std::string()) + wait_params(c, ps, part.wait);
    g.remote.push_back(std::move(part));
  }
  g.merge = [&st, c](const std::vector<std::string>& parts) { return merge_counts(st, c, parts); };
  return g;
}

}  // namespace kstate::server::api
