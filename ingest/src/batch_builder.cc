#include "ingest/batch_builder.h"

#include <algorithm>
#include <array>
#include <chrono>

#include "core/json_check.h"
#include "core/utf8.h"
#include "core/value_codec.h"

namespace kstate::ingest {

namespace {

// Why `text` is not a JSON document within the depth bound, or empty. `what` names the
// part and its format setting, e.g. "value" / "value_format json".
std::string json_problem(std::string_view text, int max_json_depth, const char* what, const char* setting) {
  switch (check_json(text, max_json_depth)) {
    case json_verdict::ok: return {};
    case json_verdict::invalid: return std::string(what) + " is not valid JSON (" + setting + ")";
    case json_verdict::too_deep:
      return std::string(what) + " is nested deeper than max_json_depth (" + std::to_string(max_json_depth) + ")";
  }
  return std::string(what) + " is not valid JSON (" + setting + ")";
}

}  // namespace

std::string validate(const view_def& view, const record& r, int max_json_depth) {
  if (!r.key) return "null key: a table needs a key";
  if (view.versioned && r.timestamp < 0) return "no record timestamp: a versioned view places versions by it";
  switch (view.key_format) {
    case data_format::string:
      if (!valid_utf8(*r.key)) return "key is not valid UTF-8 (key_format string)";
      break;
    case data_format::json:
      if (auto why = json_problem(*r.key, max_json_depth, "key", "key_format json"); !why.empty()) return why;
      break;
    case data_format::bytes: break;
  }
  if (!r.value) return {};  // tombstone: valid for every format
  switch (view.value_format) {
    case data_format::string:
      if (!valid_utf8(*r.value)) return "value is not valid UTF-8 (value_format string)";
      break;
    case data_format::json:
      if (auto why = json_problem(*r.value, max_json_depth, "value", "value_format json"); !why.empty()) return why;
      break;
    case data_format::bytes: break;
  }
  return {};
}

batch_builder::batch_builder(storage::db& db, int max_json_depth, std::function<int64_t()> clock)
    : db_(db), max_json_depth_(max_json_depth), clock_(std::move(clock)), batch_(db.new_batch()) {
  if (!clock_)
    clock_ = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
}

result<std::unique_ptr<batch_builder>> batch_builder::create(storage::db& db, const std::vector<view_def>& views,
                                                             int max_json_depth, std::function<int64_t()> clock) {
  std::unique_ptr<batch_builder> b(new batch_builder(db, max_json_depth, std::move(clock)));
  for (const auto& v : views) {
    if (v.is_aggregate()) continue;  // applied by the aggregate pipeline
    auto id = db.find_view(v.name);
    if (!id) return status::internal("view '" + v.name + "' has no column family");
    b->by_topic_[v.topic].push_back(view_slot{&v, *id});
  }
  return b;
}

void batch_builder::set_view_position(std::string_view topic, int32_t partition, const std::string& view,
                                      int64_t next_offset) {
  auto id = db_.find_view(view);
  if (!id) return;
  view_pos_[{*id, std::string(topic), partition}] = view_position{next_offset, false};
}

void batch_builder::set_catch_up(std::string_view topic, int32_t partition, int64_t end) {
  catch_up_[{std::string(topic), partition}] = end;
  cursor_valid_ = false;
}

int64_t batch_builder::ttl_time(const ttl_spec& ttl, const record& r, bool catching_up, int64_t now) noexcept {
  if (r.timestamp < 0) return now;
  if (ttl.clock == ttl_clock::record_time) return r.timestamp;
  return catching_up ? std::min(now, r.timestamp) : now;
}

void batch_builder::forget_partition(std::string_view topic, int32_t partition) {
  catch_up_.erase({std::string(topic), partition});
  cursor_valid_ = false;
  auto it = by_topic_.find(topic);
  if (it == by_topic_.end()) return;
  // Positions this batch already moved stay in it, as if written with each record.
  write_positions();
  cursor_valid_ = false;
  for (const auto& slot : it->second) view_pos_.erase({slot.id, std::string(topic), partition});
}

std::optional<int64_t> batch_builder::resume_offset(std::string_view topic, int32_t partition) const {
  auto it = by_topic_.find(topic);
  if (it == by_topic_.end()) return std::nullopt;
  std::optional<int64_t> lowest;
  for (const auto& slot : it->second) {
    auto p = view_pos_.find(std::make_tuple(slot.id, std::string(topic), partition));
    if (p == view_pos_.end()) return std::nullopt;
    if (!lowest || p->second.next < *lowest) lowest = p->second.next;
  }
  return lowest;
}

batch_builder::partition_cursor& batch_builder::cursor_for(std::string_view topic, int32_t partition) {
  auto& c = cursor_;
  if (cursor_valid_ && c.partition == partition && c.topic == topic) return c;
  c.topic.assign(topic);
  c.partition = partition;
  c.tp = {c.topic, partition};
  c.totals = &counts_[c.tp];
  c.touched = &touched_[c.tp];
  c.positions.clear();
  c.per_view.clear();
  auto it = by_topic_.find(topic);
  c.slots = it == by_topic_.end() ? nullptr : &it->second;
  auto cu = catch_up_.find(c.tp);
  c.catch_up_end = cu == catch_up_.end() ? 0 : cu->second;
  if (c.slots) {
    for (const auto& slot : *c.slots) {
      c.positions.push_back(&view_pos_[std::make_tuple(slot.id, c.topic, partition)]);
      c.per_view.push_back(&view_counts_[std::make_tuple(slot.def->name, c.topic, partition)]);
    }
  }
  cursor_valid_ = true;
  return c;
}

void batch_builder::add(const record& r) {
  auto& cur = cursor_for(r.topic, r.partition);
  auto& c = *cur.totals;
  ++c.records;
  c.bytes += (r.key ? r.key->size() : 0) + (r.value ? r.value->size() : 0);
  ++pending_;
  if (!cur.slots) return;

  std::optional<int64_t> now;
  for (size_t i = 0; i < cur.slots->size(); ++i) {
    const auto& slot = (*cur.slots)[i];
    auto& pos = *cur.positions[i];
    // A view that already reflects this offset (e.g. added to a topic other views read)
    // must not apply it twice.
    if (r.offset < pos.next) continue;
    auto reason = validate(*slot.def, r, max_json_depth_);
    auto& vc = *cur.per_view[i];
    if (!reason.empty()) {
      ++c.invalid;
      ++vc.invalid;
      rejections_.push_back(rejection{slot.def->name, slot.def->dead_letter_topic, cur.topic, r.partition, r.offset,
                                      r.key ? std::optional<std::string>(std::string(*r.key)) : std::nullopt,
                                      r.value ? std::optional<std::string>(std::string(*r.value)) : std::nullopt,
                                      std::move(reason)});
    } else if (slot.def->versioned) {
      if (!now) now = clock_();
      if (r.timestamp > *now && r.timestamp - *now > slot.def->versioned->max_future_ms) {
        // A far-future timestamp would move stream time ahead and make every later
        // record too late to place.
        ++c.invalid;
        ++vc.invalid;
        rejections_.push_back(rejection{slot.def->name, slot.def->dead_letter_topic, cur.topic, r.partition, r.offset,
                                        std::optional<std::string>(std::string(*r.key)),
                                        r.value ? std::optional<std::string>(std::string(*r.value)) : std::nullopt,
                                        "record timestamp is more than versioned.max_future ahead of the clock"});
      } else {
        // Every record is a version: placed by db::write in arrival order, never folded
        // into the last change of its key as the latest-only views' writes are.
        batch_.put_version(slot.id, r.partition, *r.key, r.timestamp, r.offset, r.value);
        ++c.applied;
        ++vc.applied;
      }
    } else if (r.value) {
      std::optional<int64_t> time;
      if (slot.def->ttl) {
        if (!now) now = clock_();  // once per record, whatever number of views has a ttl
        time = ttl_time(*slot.def->ttl, r, r.offset < cur.catch_up_end, *now);
      }
      stage(slot.id, r.partition, *r.key, r.value, r.offset, time);
      ++c.applied;
      ++vc.applied;
    } else {
      stage(slot.id, r.partition, *r.key, std::nullopt, r.offset, std::nullopt);
      ++c.applied;
      ++vc.applied;
    }
    // The position advances past rejected records too: they are handled (counted,
    // dead-lettered) and must not be read again.
    pos.next = r.offset + 1;
    pos.dirty = true;
  }
  *cur.touched = r.offset + 1;
}

void batch_builder::stage(storage::view_id view, int32_t partition, std::string_view key,
                          std::optional<std::string_view> value, int64_t offset, std::optional<int64_t> time) {
  staged s;
  s.view = view;
  s.partition = partition;
  s.offset = offset;
  s.time = time.value_or(0);
  s.timed = time.has_value();
  s.key_at = arena_.size();
  s.key_size = static_cast<uint32_t>(key.size());
  arena_.append(key);
  s.value_at = arena_.size();
  s.deleted = !value;
  if (value) {
    s.value_size = static_cast<uint32_t>(value->size());
    arena_.append(*value);
  }
  staged_.push_back(s);
}

void batch_builder::write_staged() {
  if (staged_.empty()) return;
  // In (view, partition, key) order, each key once with its last change of the batch:
  // RocksDB's memtable inserts keys that arrive in order with fewer comparisons, and a
  // key changed twice in a batch is written once.
  order_.resize(staged_.size());
  for (uint32_t i = 0; i < order_.size(); ++i) order_[i] = i;
  const auto key_of = [this](const staged& s) { return std::string_view(arena_.data() + s.key_at, s.key_size); };
  std::sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) {
    const staged& x = staged_[a];
    const staged& y = staged_[b];
    if (x.view != y.view) return x.view < y.view;
    if (x.partition != y.partition) return x.partition < y.partition;
    if (int c = key_of(x).compare(key_of(y)); c != 0) return c < 0;
    return a < b;  // arrival order: the last change of a key comes last
  });
  for (size_t i = 0; i < order_.size(); ++i) {
    const staged& s = staged_[order_[i]];
    if (i + 1 < order_.size()) {
      const staged& next = staged_[order_[i + 1]];
      if (next.view == s.view && next.partition == s.partition && key_of(next) == key_of(s)) continue;
    }
    if (s.deleted) {
      batch_.del(s.view, s.partition, key_of(s));
    } else if (s.timed) {
      // Stored as frame_value(offset, time, value), gathered from both parts.
      const auto frame = frame_header(s.offset, s.time);
      batch_.put(s.view, s.partition, key_of(s), std::string_view(frame.data(), frame.size()),
                 std::string_view(arena_.data() + s.value_at, s.value_size));
    } else {
      // Stored as frame_value(offset, value), gathered from both parts.
      const auto frame = frame_header(s.offset);
      batch_.put(s.view, s.partition, key_of(s), std::string_view(frame.data(), frame.size()),
                 std::string_view(arena_.data() + s.value_at, s.value_size));
    }
  }
  staged_.clear();
  arena_.clear();
}

void batch_builder::write_positions() {
  write_staged();
  for (auto& [key, pos] : view_pos_) {
    if (!pos.dirty) continue;
    batch_.set_position(std::get<0>(key), std::get<2>(key), pos.next);
    pos.dirty = false;
  }
}

storage::write_batch& batch_builder::batch() {
  write_positions();
  return batch_;
}

void batch_builder::reject(const view_def& view, const record& r, std::string reason) {
  ++counts_[{std::string(r.topic), r.partition}].invalid;
  ++view_counts_[std::make_tuple(view.name, std::string(r.topic), r.partition)].invalid;
  rejections_.push_back(rejection{view.name, view.dead_letter_topic, std::string(r.topic), r.partition, r.offset,
                                  r.key ? std::optional<std::string>(std::string(*r.key)) : std::nullopt,
                                  r.value ? std::optional<std::string>(std::string(*r.value)) : std::nullopt,
                                  std::move(reason)});
}

void batch_builder::note_applied(const std::string& view, std::string_view topic, int32_t partition) {
  ++counts_[{std::string(topic), partition}].applied;
  ++view_counts_[std::make_tuple(view, std::string(topic), partition)].applied;
}

built_batch batch_builder::take(std::optional<storage::write_batch> fresh) {
  write_positions();
  built_batch out{fresh ? std::move(*fresh) : db_.new_batch(),
                  std::move(rejections_),
                  std::move(touched_),
                  std::move(counts_),
                  std::move(view_counts_),
                  {},
                  pending_};
  std::swap(out.batch, batch_);
  rejections_.clear();
  touched_.clear();
  counts_.clear();
  view_counts_.clear();
  cursor_valid_ = false;
  pending_ = 0;
  return out;
}

void batch_builder::reset() {
  batch_.clear();
  staged_.clear();
  arena_.clear();
  for (auto& [key, pos] : view_pos_) pos.dirty = false;
  rejections_.clear();
  touched_.clear();
  counts_.clear();
  view_counts_.clear();
  cursor_valid_ = false;
  pending_ = 0;
}

}  // namespace kstate::ingest
