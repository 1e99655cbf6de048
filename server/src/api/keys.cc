// Handlers of one key (a lookup, where it lives, its windows) and of a batch of keys.

#include <map>
#include <unordered_map>
#include <unordered_set>

#include "api/handlers.h"
#include "api/params.h"
#include "api/placement.h"
#include "api/render.h"
#include "core/json_check.h"
#include "ingest/standby.h"
#include "server/json_render.h"
#include "server/problem.h"

namespace kstate::server::api {
namespace {

// A windowed store's stored keys are (group key, window start) pairs: reading them as
// plain keys would show encoded bytes, so the key routes send the caller to /windows.
http::response windowed_store_problem(const call& c, const std::string& route) {
  return problem(failure_reason::bad_request,
                 "store '" + c.store + "' is windowed; read its windows at /v1/stores/" + c.store + route, c.path());
}

http::response not_held_problem(const call& c, const view_def& v, int32_t p) {
  if (c.from_peer)
    return problem(failure_reason::not_owner,
                   "a forwarded request reached an instance that does not own the partition; the group is rebalancing",
                   c.path());
  return problem(failure_reason::not_owner,
                 "partition " + std::to_string(p) + " of '" + v.topic + "' is not assigned to this instance", c.path());
}

// The answer for one key, written straight into the body without a DOM and without
// re-parsing the stored value: {key, offset, partition, position, served_by, store,
// value}, and for a stale copy (`lag` given) also lag and "stale": true.
std::string key_answer(const state& st, const call& c, const view_def& v, const std::string& key,
                       const query::key_answer& a, const nlohmann::json* lag) {
  std::string b;
  b.reserve(128 + key.size() + a.value->size() + c.store.size() + st.ctx.instance.size());
  b += "{\"key\":";
  append_rendered_key(b, v.key_format, key);
  if (lag) {
    b += ",\"lag\":";
    b += lag->dump();
  }
  b += ",\"offset\":";
  append_int(b, a.offset);
  b += ",\"partition\":";
  append_int(b, a.partition);
  b += ",\"position\":";
  append_position(b, a.pos);
  b += ",\"served_by\":";
  append_json_string(b, st.ctx.instance);
  if (lag) b += ",\"stale\":true";
  b += ",\"store\":";
  append_json_string(b, c.store);
  if (a.valid_from) {  // an as_of answer: the version's validity
    b += ",\"valid_from\":";
    append_int(b, *a.valid_from);
    b += ",\"valid_to\":";
    if (a.valid_to) append_int(b, *a.valid_to);
    else b += "null";
  }
  b += ",\"value\":";
  append_rendered_value(b, v.value_format, *a.value);
  b += '}';
  return b;
}

// The 404 of a key absent as of the answer's position, written straight into the body:
// the problem's members and where the key is absent (partition, position, served_by,
// and for a stale copy lag and "stale": true), in dump()'s key order, as problem_json()
// with those members added would print them.
http::response absent_key(const state& st, const call& c, const std::string& detail, const query::key_answer& a,
                          const nlohmann::json* lag) {
  const auto info = describe(failure_reason::key_not_found);
  http::response r;
  r.status = info.status;
  r.content_type = "application/problem+json";
  std::string& b = r.body;
  b.reserve(256 + detail.size() + c.path().size());
  b += "{\"detail\":";
  append_json_string(b, detail);
  b += ",\"error_code\":";
  append_int(b, info.error_code);
  if (!c.path().empty()) {
    b += ",\"instance\":";
    append_json_string(b, c.path());
  }
  if (lag) {
    b += ",\"lag\":";
    b += lag->dump();
  }
  b += ",\"partition\":";
  append_int(b, a.partition);
  b += ",\"position\":";
  append_position(b, a.pos);
  b += ",\"served_by\":";
  append_json_string(b, st.ctx.instance);
  if (lag) b += ",\"stale\":true";
  b += ",\"status\":";
  append_int(b, info.status);
  b += ",\"title\":";
  append_json_string(b, info.title);
  b += ",\"type\":\"/problems/";
  b += name_of(failure_reason::key_not_found);
  b += "\"}";
  r.with_header("X-Kstate-Position", position_header(a.pos));
  return r;
}

// The detail of a 404 for an as_of lookup.
std::string absent_then(int64_t as_of) {
  return "no value for this key at " + std::to_string(as_of) + " (no version, or a tombstone, was valid then)";
}

// An answer from this instance's own copy of the key's partition (a former owner's or a
// standby's), marked stale with its lag; nullopt when there is no copy here.
std::optional<http::response> stale_answer(const state& st, const call& c, const view_def& v, const std::string& key,
                                           int32_t partition, std::optional<int64_t> as_of) {
  auto res = st.ctx.queries->get_stale({c.store, key, partition, as_of});
  if (!res.ok()) return std::nullopt;
  const auto& a = res.answer();
  int64_t pos = a.pos.at(a.partition).value_or(0);
  nlohmann::json lag = nullptr;
  if (st.ctx.high_watermark)
    if (auto hw = st.ctx.high_watermark(v.topic, a.partition)) lag = std::max<int64_t>(0, *hw - pos);
  if (!a.value)
    return absent_key(st, c, as_of ? absent_then(*as_of) : "no value for this key in this instance's stale copy", a,
                      &lag)
        .with_header("X-Kstate-Stale", "true");
  http::response r;
  r.body = key_answer(st, c, v, key, a, &lag);
  r.with_header("X-Kstate-Position", position_header(a.pos)).with_header("X-Kstate-Stale", "true");
  return r;
}

// The lookup of a key held here (the min_position wait, if any, is over).
http::response read_key(const state& st, const call& c, const view_def& v, const std::string& key, int32_t partition,
                        bool allow_stale, std::optional<int64_t> as_of) {
  auto res = st.ctx.queries->get({c.store, key, partition, as_of});
  if (!res.ok()) {
    // Held here but catching up (or revoked since): a stale copy if the caller takes one.
    if (allow_stale && res.failure() != query::failure_reason::store_exception &&
        res.failure() != query::failure_reason::history_unavailable &&
        res.failure() != query::failure_reason::too_many_keys)
      if (auto s = stale_answer(st, c, v, key, partition, as_of)) return std::move(*s);
    return from_failure(res.failure(), res.message(), c.path());
  }
  const auto& a = res.answer();
  // The absence is as fresh as the position: say which.
  if (!a.value)
    return absent_key(st, c, as_of ? absent_then(*as_of) : "no value for this key in store '" + c.store + "'", a,
                      nullptr);
  http::response r;
  r.body = key_answer(st, c, v, key, a, nullptr);
  r.with_header("X-Kstate-Position", position_header(a.pos));
  return r;
}

// The serialized key the path names, with its view; or the 4xx answer.
struct named_key {
  const view_def* view;
  std::string key;
  int32_t partition;
};
param<named_key> key_of(const state& st, const call& c) {
  auto view = store_of(st, c);
  if (!view.ok()) return std::move(view).error();
  auto fmt = key_format_of(c, **view);
  if (!fmt.ok()) return std::move(fmt).error();
  auto key = decode_key(st, c, *fmt, c.key);
  if (!key.ok()) return std::move(key).error();
  auto loc = st.ctx.queries->locate(c.store, *key);
  if (!loc)
    return problem(failure_reason::not_caught_up, "partition count of '" + (*view)->topic + "' not known yet",
                   c.path());
  return named_key{*view, std::move(*key), loc->second};
}

}  // namespace

outcome get_key(const state& st, const call& c) {
  auto k = key_of(st, c);
  if (!k.ok()) return std::move(k).error();
  const view_def& v = *k->view;  // NOLINT(clang-analyzer-core.uninitialized.Assign): k is ok here
  if (v.window) return windowed_store_problem(c, "/windows/{key}");
  auto as_of_param = as_of_of(c, v);
  if (!as_of_param.ok()) return std::move(as_of_param).error();
  const std::optional<int64_t> as_of = *as_of_param;
  const int32_t p = k->partition;
  const bool allow_stale = c.r().param("allow_stale") == "true";
  if (allow_stale && !c.from_peer)
    if (auto ps = st.ctx.ownership->partition(v.topic, p); ps && ps->assigned && !ps->ready) {
      // Held here but catching up, and no copy of it here yet (a new instance): another
      // instance's copy, if one answers; else this instance's own refusal.
      if (!stale_answer(st, c, v, k->key, p, as_of))
        if (auto copies = copy_holders(st, v.topic, p, std::nullopt); !copies.empty()) {
          // Caught up meanwhile: this instance's own answer after all.
          auto own = [&st, c, v = &v, key = k->key, p, as_of]() -> std::optional<http::response> {
            auto r = read_key(st, c, *v, key, p, true, as_of);
            if (r.status == 503) return std::nullopt;
            return r;
          };
          forward_plan f{copies.front(), std::move(own), {}};
          f.copies.assign(copies.begin() + 1, copies.end());
          return f;
        }
    }
  if (held_here(st, v.topic, p)) {
    // Only the key's partition matters to this answer.
    return local_plan{bound_for(c, {p}), true, [&st, c, v = &v, key = std::move(k->key), p, allow_stale, as_of] {
                        return read_key(st, c, *v, key, p, allow_stale, as_of);
                      }};
  }
  if (!c.from_peer)
    if (auto owner = owner_of(st, v.topic, p)) {
      forward_plan f{*owner, {}, {}};
      if (allow_stale) {
        f.stale = [&st, c, v = &v, key = k->key, p, as_of] { return stale_answer(st, c, *v, key, p, as_of); };
        f.copies = copy_holders(st, v.topic, p, owner);
      }
      return f;
    }
  if (allow_stale) {
    if (auto s = stale_answer(st, c, v, k->key, p, as_of)) return std::move(*s);
    // No owner to ask (a rebalance under way) and no copy here: another instance's copy.
    if (!c.from_peer)
      if (auto copies = copy_holders(st, v.topic, p, std::nullopt); !copies.empty()) {
        forward_plan f{copies.front(), {}, {}};
        f.copies.assign(copies.begin() + 1, copies.end());
        return f;
      }
  }
  return not_held_problem(c, v, p);
}

outcome key_windows(const state& st, const call& c) {
  auto k = key_of(st, c);
  if (!k.ok()) return std::move(k).error();
  const view_def& v = *k->view;  // NOLINT(clang-analyzer-core.uninitialized.Assign): k is ok here
  if (!v.window)
    return problem(failure_reason::bad_request,
                   "store '" + c.store + "' is not windowed; read its keys at /v1/stores/" + c.store + "/keys/{key}",
                   c.path());
  auto interval = interval_of(c);
  if (!interval.ok()) return std::move(interval).error();
  const int32_t p = k->partition;
  if (!held_here(st, v.topic, p)) {
    if (!c.from_peer)
      if (auto owner = owner_of(st, v.topic, p)) return forward_plan{*owner, {}, {}};
    return not_held_problem(c, v, p);
  }
  // Not cheap: a long interval of small windows can be many entries, read on a worker.
  return local_plan{{}, false, [&st, c, v = &v, key = std::move(k->key), p, interval = *interval] {
                      const std::size_t max_bytes = st.ctx.limits.max_response_bytes;
                      auto res = st.ctx.queries->windows({c.store, key, p, interval.first, interval.second, max_bytes});
                      if (!res.ok()) return from_failure(res.failure(), res.message(), c.path());
                      const auto& a = res.answer();
                      auto too_large = [&] {
                        return problem(failure_reason::answer_too_large,
                                       "the windows of this key in [from, to) exceed query.max_response_bytes (" +
                                           std::to_string(max_bytes) +
                                           " bytes); ask for a shorter interval, or page with /v1/stores/" + c.store +
                                           "/windows",
                                       c.path());
                      };
                      if (a.truncated) return too_large();
                      // {data, key, partition, position, served_by, store, stream_time}
                      http::response r;
                      std::string& b = r.body;
                      b += "{\"data\":[";
                      for (std::size_t i = 0; i < a.windows.size(); ++i) {
                        const auto& w = a.windows[i];
                        if (i) b += ',';
                        append_window(b, *v, nullptr, w.start, w.end, w.value, w.offset, std::nullopt);
                      }
                      b += "],\"key\":";
                      append_rendered_key(b, v->key_format, key);
                      b += ",\"partition\":";
                      append_int(b, a.partition);
                      b += ",\"position\":";
                      append_position(b, a.pos);
                      b += ",\"served_by\":";
                      append_json_string(b, st.ctx.instance);
                      b += ",\"store\":";
                      append_json_string(b, c.store);
                      b += ",\"stream_time\":";
                      append_int(b, a.stream_time);
                      b += '}';
                      if (b.size() > max_bytes) return too_large();
                      r.with_header("X-Kstate-Position", position_header(a.pos));
                      return r;
                    }};
}

outcome key_versions(const state& st, const call& c) {
  auto k = key_of(st, c);
  if (!k.ok()) return std::move(k).error();
  const view_def& v = *k->view;  // NOLINT(clang-analyzer-core.uninitialized.Assign): k is ok here
  if (v.window) return windowed_store_problem(c, "/windows/{key}");
  if (!v.versioned)
    return problem(failure_reason::bad_request,
                   "store '" + c.store +
                       "' keeps only the latest value of each key; set versioned: {history: ...} on the view to keep "
                       "its versions",
                   c.path());
  auto interval = interval_of(c);
  if (!interval.ok()) return std::move(interval).error();
  auto limit = limit_of(st, c);
  if (!limit.ok()) return std::move(limit).error();
  const int32_t p = k->partition;
  if (!held_here(st, v.topic, p)) {
    if (!c.from_peer)
      if (auto owner = owner_of(st, v.topic, p)) return forward_plan{*owner, {}, {}};
    return not_held_problem(c, v, p);
  }
  // Bounded by the limit: cheap enough for the I/O thread, as a lookup is.
  return local_plan{{}, true, [&st, c, v = &v, key = std::move(k->key), p, interval = *interval, limit = *limit] {
                      auto res = st.ctx.queries->versions({c.store, key, p, interval.first, interval.second, limit});
                      if (!res.ok()) return from_failure(res.failure(), res.message(), c.path());
                      const auto& a = res.answer();
                      // {data, history_start, key, metadata, partition, position, served_by, store}
                      http::response r;
                      std::string& b = r.body;
                      b += "{\"data\":[";
                      for (std::size_t i = 0; i < a.versions.size(); ++i) {
                        const auto& e = a.versions[i];
                        if (i) b += ',';
                        b += "{\"deleted\":";
                        b += e.value ? "false" : "true";
                        b += ",\"offset\":";
                        append_int(b, e.offset);
                        b += ",\"valid_from\":";
                        append_int(b, e.valid_from);
                        b += ",\"valid_to\":";
                        if (e.valid_to) append_int(b, *e.valid_to);
                        else b += "null";
                        b += ",\"value\":";
                        if (e.value) append_rendered_value(b, v->value_format, *e.value);
                        else b += "null";
                        b += '}';
                      }
                      b += "],\"history_start\":";
                      if (a.history_start) append_int(b, *a.history_start);
                      else b += "null";
                      b += ",\"key\":";
                      append_rendered_key(b, v->key_format, key);
                      // The next page: the same interval ending where the last version began.
                      b += ",\"metadata\":{\"next\":";
                      if (a.more && !a.versions.empty()) append_int(b, a.versions.back().valid_from);
                      else b += "null";
                      b += "},\"partition\":";
                      append_int(b, a.partition);
                      b += ",\"position\":";
                      append_position(b, a.pos);
                      b += ",\"served_by\":";
                      append_json_string(b, st.ctx.instance);
                      b += ",\"store\":";
                      append_json_string(b, c.store);
                      b += '}';
                      if (b.size() > st.ctx.limits.max_response_bytes)
                        return problem(failure_reason::answer_too_large,
                                       "these versions exceed query.max_response_bytes (" +
                                           std::to_string(st.ctx.limits.max_response_bytes) +
                                           " bytes); ask for a smaller limit",
                                       c.path());
                      r.with_header("X-Kstate-Position", position_header(a.pos));
                      return r;
                    }};
}

outcome key_metadata(const state& st, const call& c) {
  auto k = key_of(st, c);
  if (!k.ok()) return std::move(k).error();
  const view_def& v = *k->view;  // NOLINT(clang-analyzer-core.uninitialized.Assign): k is ok here
  const int32_t p = k->partition;
  nlohmann::json owner = nullptr;
  uint64_t version = 0;
  std::vector<std::string> standbys;
  if (st.ctx.membership) {
    auto snap = st.ctx.membership->current();
    version = snap->version;
    if (auto o = snap->owner(v.topic, p)) owner = *o;
    standbys = ingest::standbys_for(*snap, v.topic, p, st.ctx.standby_replicas);
  }
  const bool here = held_here(st, v.topic, p);
  if (owner.is_null() && here) owner = st.ctx.instance;
  nlohmann::json body{{"store", c.store},
                      {"topic", v.topic},
                      {"partition", p},
                      {"partitioner", v.partitioner},
                      {"active_owner", owner},
                      {"standbys", standbys},
                      {"owned_here", here},
                      {"membership_version", version},
                      {"served_by", st.ctx.instance}};
  std::string key_json;
  append_rendered_key(key_json, v.key_format, k->key);
  body["key"] = nlohmann::json::parse(key_json);
  http::response r;
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

// --- batches ----------------------------------------------------------------------

namespace {

struct batch_key {
  std::string key;   // serialized
  std::string text;  // as the client wrote it (what an owner is sent)
  int32_t partition;
};

// Renders the found keys of `keys` held here, in the part framing (for a peer, or for
// the merge of a gathered batch).
part_result read_batch_part(const state& st, const call& c, const view_def& v, const std::vector<batch_key>& keys,
                            std::optional<int64_t> as_of) {
  std::vector<std::pair<int32_t, std::string>> located;
  located.reserve(keys.size());
  for (const auto& k : keys) located.emplace_back(k.partition, k.key);
  auto res = st.ctx.queries->get_many(c.store, std::move(located), as_of);
  if (!res.ok()) return from_failure(res.failure(), res.message(), c.path());
  part_writer w(nlohmann::json{{"position", position_json(res.answer().pos)}});
  std::string entry;
  for (const auto& e : res.answer().entries) {
    if (!e.value) continue;
    entry.clear();
    append_entry(entry, v, e.key, *e.value, e.partition, e.offset);
    w.add(e.key, entry);
  }
  return w.take();
}

// {"data":[...],"metadata":{"position":{..}},"missing":[...],"served_by":..}: the
// entries of `keys` that `entry_of` finds (their JSON), in the order of `keys`.
template <typename EntryOf>
http::response render_batch(const state& st, const call& c, const view_def& v, const std::vector<batch_key>& keys,
                            const position& pos, EntryOf entry_of) {
  http::response r;
  std::string& b = r.body;
  b += "{\"data\":[";
  bool first = true;
  std::string missing;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!entry_of(i, b, first)) {
      if (!missing.empty()) missing += ',';
      append_rendered_key(missing, v.key_format, keys[i].key);
      continue;
    }
    first = false;
  }
  b += "],\"metadata\":{\"position\":";
  append_position(b, pos);
  b += "},\"missing\":[";
  b += missing;
  b += "],\"served_by\":";
  append_json_string(b, st.ctx.instance);
  b += '}';
  if (b.size() > st.ctx.limits.max_response_bytes)
    return problem(failure_reason::answer_too_large,
                   "the answer would exceed query.max_response_bytes (" +
                       std::to_string(st.ctx.limits.max_response_bytes) + " bytes); ask for fewer keys",
                   c.path());
  r.with_header("X-Kstate-Position", position_header(pos));
  return r;
}

// The answer from the parts of every owner (each in the part framing).
http::response merge_batch(const state& st, const call& c, const view_def& v, const std::vector<batch_key>& keys,
                           const std::vector<std::string>& parts) {
  std::unordered_map<std::string_view, std::string_view> found;
  position pos;
  std::vector<part_view> views;
  views.reserve(parts.size());
  for (const auto& p : parts) {
    auto pv = read_part(p);
    if (!pv) return problem(failure_reason::internal, "an owner's part of the batch is malformed", c.path());
    for (const auto& e : pv->entries) found.emplace(e.stored_key, e.entry_json);
    pos.merge(pv->pos);
    views.push_back(std::move(*pv));
  }
  return render_batch(st, c, v, keys, pos, [&](std::size_t i, std::string& b, bool first) {
    auto it = found.find(keys[i].key);
    if (it == found.end()) return false;
    if (!first) b += ',';
    b.append(it->second.data(), it->second.size());
    return true;
  });
}

// The answer when every key is held here: rendered straight from one read.
http::response local_batch(const state& st, const call& c, const view_def& v, const std::vector<batch_key>& keys,
                           std::optional<int64_t> as_of) {
  std::vector<std::pair<int32_t, std::string>> located;
  located.reserve(keys.size());
  for (const auto& k : keys) located.emplace_back(k.partition, k.key);
  auto res = st.ctx.queries->get_many(c.store, std::move(located), as_of);
  if (!res.ok()) return from_failure(res.failure(), res.message(), c.path());
  const auto& entries = res.answer().entries;  // in the order of `keys`
  return render_batch(st, c, v, keys, res.answer().pos, [&](std::size_t i, std::string& b, bool first) {
    const auto& e = entries[i];
    if (!e.value) return false;
    if (!first) b += ',';
    append_entry(b, v, e.key, *e.value, e.partition, e.offset);
    return true;
  });
}

}  // namespace

outcome batch_get(const state& st, const call& c) {
  auto view = store_of(st, c);
  if (!view.ok()) return std::move(view).error();
  const view_def& v = **view;
  if (v.window) return windowed_store_problem(c, "/windows/{key}");
  auto ct = c.r().header("content-type").value_or("");
  if (ct.rfind("application/json", 0) != 0)
    return problem(failure_reason::unsupported_media, "send the body as application/json", c.path());
  const media m = negotiate(c, false);
  if (m == media::none) return problem(failure_reason::not_acceptable, "this route answers application/json", c.path());
  const auto& text = c.r().body;
  switch (check_json(text, st.ctx.limits.max_json_depth)) {
    case json_verdict::ok: break;
    case json_verdict::invalid:
      return problem(failure_reason::bad_body, R"(expected {"keys": ["k1", "k2", ...]})", c.path());
    case json_verdict::too_deep:
      return problem(failure_reason::bad_body,
                     "the body nests deeper than " + std::to_string(st.ctx.limits.max_json_depth) + " levels",
                     c.path());
  }
  auto body = nlohmann::json::parse(text, nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("keys") || !body["keys"].is_array())
    return problem(failure_reason::bad_body, R"(expected {"keys": ["k1", "k2", ...]})", c.path());
  for (const auto& [k, val] : body.items())
    if (k != "keys" && k != "key_format")
      return problem(failure_reason::bad_body, "unknown field '" + k.substr(0, 64) + "' in the body", c.path());
  const auto& keys = body["keys"];
  if (keys.size() > st.ctx.limits.max_batch_keys)
    return problem(failure_reason::payload_too_large,
                   "at most " + std::to_string(st.ctx.limits.max_batch_keys) + " keys per batch", c.path());
  auto fmt = key_format_of(c, v);
  if (!fmt.ok()) return std::move(fmt).error();
  auto as_of_param = as_of_of(c, v);
  if (!as_of_param.ok()) return std::move(as_of_param).error();
  const std::optional<int64_t> as_of = *as_of_param;
  if (body.contains("key_format")) {
    query::key_format f;
    if (!body["key_format"].is_string() || !query::parse_key_format(body["key_format"].get<std::string>(), f))
      return problem(failure_reason::bad_body, "key_format must be one of: string, base64url, long, json", c.path());
    *fmt = f;
  }
  // Each distinct key once, in the order of its first appearance: a key asked twice is
  // read and answered once.
  std::vector<batch_key> distinct;
  distinct.reserve(keys.size());  // never reallocates: `seen` points into its keys
  std::unordered_set<std::string_view> seen;
  seen.reserve(keys.size());
  std::map<int32_t, bool> partitions;
  std::optional<query::engine::key_locator> where_is;  // found for the first key, used for all
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto& k = keys[i];
    // json keys may be given as JSON values; every other format as strings.
    std::string key_text;
    if (k.is_string()) key_text = k.get<std::string>();
    else if (*fmt == query::key_format::json) key_text = k.dump();
    else return problem(failure_reason::bad_body, "keys must be strings", c.path());
    auto d = decode_key(st, c, *fmt, key_text, "keys", i);
    if (!d.ok()) return std::move(d).error();
    if (seen.count(*d)) continue;
    if (!where_is) where_is = st.ctx.queries->locator(c.store);
    if (!where_is)
      return problem(failure_reason::not_caught_up, "partition count of '" + v.topic + "' not known yet", c.path());
    const int32_t p = (*where_is)(*d);
    partitions[p] = true;
    distinct.push_back(batch_key{std::move(*d), std::move(key_text), p});
    seen.insert(distinct.back().key);
  }
  std::vector<int32_t> parts;
  parts.reserve(partitions.size());
  for (const auto& [p, _] : partitions) parts.push_back(p);
  auto where = place(st, c, v, parts);
  if (!where.ok()) return std::move(where).error();

  auto shared_keys = std::make_shared<const std::vector<batch_key>>(std::move(distinct));
  if (m == media::part || c.from_peer) {
    // A peer's part: every key is held here (place() refused otherwise).
    return local_plan{bound_for(c, parts), true, [&st, c, v = &v, shared_keys, as_of] {
                        auto part = read_batch_part(st, c, *v, *shared_keys, as_of);
                        if (auto* failed = std::get_if<http::response>(&part)) return std::move(*failed);
                        http::response r;
                        r.content_type = std::string(part_media_type);
                        r.body = std::move(std::get<std::string>(part));
                        return r;
                      }};
  }
  if (where->remote.empty()) {
    return local_plan{bound_for(c, parts), true,
                      [&st, c, v = &v, shared_keys, as_of] { return local_batch(st, c, *v, *shared_keys, as_of); }};
  }
  gather_plan g;
  std::vector<batch_key> local_keys;
  std::map<std::string, std::vector<const batch_key*>> by_owner;
  for (const auto& k : *shared_keys) {
    bool local = false;
    for (int32_t p : where->local) local = local || p == k.partition;
    if (local) {
      local_keys.push_back(k);
      continue;
    }
    for (const auto& [endpoint, ps] : where->remote)
      for (int32_t p : ps)
        if (p == k.partition) by_owner[endpoint].push_back(&k);
  }
  if (!local_keys.empty()) {
    g.local_bound = bound_for(c, where->local);
    g.local = [&st, c, v = &v, local_keys = std::move(local_keys), as_of] {
      return read_batch_part(st, c, *v, local_keys, as_of);
    };
  }
  for (const auto& [endpoint, ks] : by_owner) {
    nlohmann::json part_body{{"keys", nlohmann::json::array()}, {"key_format", query::to_string(*fmt)}};
    for (const auto* k : ks) part_body["keys"].push_back(k->text);
    std::chrono::milliseconds wait{0};
    // The owner reads its keys at the same time (epoch ms: the parsed form of any
    // accepted as_of).
    auto params =
        (as_of ? "&as_of=" + std::to_string(*as_of) : std::string()) + wait_params(c, where->remote.at(endpoint), wait);
    peer_part part;
    part.endpoint = endpoint;
    part.method = "POST";
    part.target = c.path() + (params.empty() ? "" : "?" + params.substr(1));
    part.body = part_body.dump();
    part.headers.emplace_back("Content-Type", "application/json");
    part.wait = wait;
    g.remote.push_back(std::move(part));
  }
  g.merge = [&st, c, v = &v, shared_keys](const std::vector<std::string>& parts) {
    return merge_batch(st, c, *v, *shared_keys, parts);
  };
  return g;
}

}  // namespace kstate::server::api
