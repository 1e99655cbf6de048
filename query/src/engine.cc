#include "query/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

#include "core/value_codec.h"

namespace kstate::query {
namespace {

// A window's end, start + size, or the largest int64 when that is past it (a start
// near the end of the range, from an event time a record carried).
int64_t window_end(int64_t start, int64_t size) noexcept {
  int64_t end = 0;
  return __builtin_add_overflow(start, size, &end) ? std::numeric_limits<int64_t>::max() : end;
}

// A session's half-open end: its last record time + 1 (the frame's time). nullopt for
// a value without one, which a session store never writes.
std::optional<int64_t> session_end(std::optional<int64_t> last) noexcept {
  if (!last) return std::nullopt;
  return *last == std::numeric_limits<int64_t>::max() ? *last : *last + 1;
}

}  // namespace

const char* to_string(failure_reason r) noexcept {
  switch (r) {
    case failure_reason::unknown_query_store: return "UNKNOWN_QUERY_STORE";
    case failure_reason::not_active: return "NOT_ACTIVE";
    case failure_reason::not_up_to_date: return "NOT_UP_TO_DATE";
    case failure_reason::store_exception: return "STORE_EXCEPTION";
    case failure_reason::history_unavailable: return "HISTORY_UNAVAILABLE";
    case failure_reason::too_many_keys: return "TOO_MANY_KEYS";
  }
  return "UNKNOWN";
}

engine::engine(const std::vector<view_def>& views, storage::db& db, const ownership_registry& ownership,
               std::map<std::string, partitioner_fn> partitioners)
    : views_(views), db_(db), ownership_(ownership), partitioners_(partitioners.begin(), partitioners.end()) {}

const view_def* engine::find_store(std::string_view name) const {
  for (const auto& v : views_)
    if (v.name == name) return &v;
  return nullptr;
}

template <typename T>
std::optional<query_result<T>> engine::require_partition(const view_def& v, int32_t partition) const {
  using R = query_result<T>;
  auto ps = ownership_.partition(v.topic, partition);
  if (!ps || !ps->assigned)
    return R::fail(failure_reason::not_active,
                   "partition " + std::to_string(partition) + " of '" + v.topic + "' is not assigned to this instance");
  if (!ps->ready)
    return R::fail(failure_reason::not_up_to_date,
                   "partition " + std::to_string(partition) + " of '" + v.topic + "' is catching up");
  return std::nullopt;
}

template <typename T>
std::optional<query_result<T>> engine::require_all_partitions(const view_def& v, int32_t& count) const {
  count = ownership_.partition_count(v.topic);
  if (count <= 0)
    return query_result<T>::fail(failure_reason::not_up_to_date, "partition count of '" + v.topic + "' not known yet");
  for (int32_t p = 0; p < count; ++p)
    if (auto f = require_partition<T>(v, p)) return f;
  return std::nullopt;
}

std::optional<std::pair<std::string, int32_t>> engine::locate(std::string_view store, std::string_view key) const {
  auto where = locator(store);
  if (!where) return std::nullopt;
  return std::make_pair(find_store(store)->topic, (*where)(key));
}

std::optional<engine::key_locator> engine::locator(std::string_view store) const {
  const auto* view = find_store(store);
  if (!view) return std::nullopt;
  auto part_fn = partitioners_.find(view->name);
  int32_t count = ownership_.partition_count(view->topic);
  if (part_fn == partitioners_.end() || count <= 0) return std::nullopt;
  return key_locator{&part_fn->second, count};
}

template <typename T>
std::optional<query_result<T>> engine::held_key_partition(std::string_view store, std::string_view key,
                                                          std::optional<int32_t> located, const view_def*& view,
                                                          storage::view_id& vid, int32_t& partition) const {
  using R = query_result<T>;
  view = find_store(store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + std::string(store) + "'");
  auto id = db_.find_view(view->name);
  auto part_fn = partitioners_.find(view->name);
  if (!id || part_fn == partitioners_.end())
    return R::fail(failure_reason::store_exception, "store '" + std::string(store) + "' is not open");
  vid = *id;
  if (located) {
    // The caller located the key already (locate()); the partition's own state says
    // whether it is held and ready.
    partition = *located;
    return require_partition<T>(*view, partition);
  }
  int32_t count = ownership_.partition_count(view->topic);
  if (count <= 0)
    return R::fail(failure_reason::not_up_to_date, "partition count of '" + view->topic + "' not known yet");
  partition = part_fn->second(key, count);
  return require_partition<T>(*view, partition);
}

// versions.cc reads keys of versioned stores through it.
template std::optional<query_result<version_answer>> engine::held_key_partition<version_answer>(
    std::string_view, std::string_view, std::optional<int32_t>, const view_def*&, storage::view_id&, int32_t&) const;

query_result<key_answer> engine::get(const key_query& q) const {
  const view_def* view = nullptr;
  storage::view_id vid = 0;
  int32_t partition = -1;
  if (auto f = held_key_partition<key_answer>(q.store, q.key, q.partition, view, vid, partition)) return *f;
  if (q.as_of) {
    if (!view->versioned)
      return query_result<key_answer>::fail(failure_reason::store_exception,
                                            "store '" + q.store + "' is not versioned");
    return read_key_as_of(vid, partition, q.key, *q.as_of, false);
  }
  return read_key(vid, partition, q.key, false);
}

query_result<window_answer> engine::windows(const window_query& q) const {
  using R = query_result<window_answer>;
  const view_def* view = nullptr;
  storage::view_id vid = 0;
  int32_t partition = -1;
  if (auto f = held_key_partition<window_answer>(q.store, q.key, q.partition, view, vid, partition)) return *f;
  if (!view->window) return R::fail(failure_reason::store_exception, "store '" + q.store + "' is not windowed");

  const window_spec& w = *view->window;
  window_answer a;
  a.partition = partition;
  auto st = db_.stored_named_position(stream_time_position_name(*view), partition);
  if (!st.ok()) return R::fail(failure_reason::store_exception, st.error().to_string());
  a.stream_time = st.value().value_or(-1);
  if (is_session(w)) return sessions(q, vid, partition, std::move(a));
  // Windows overlapping [from, to) start in (from - size, to); expired ones are skipped.
  // `from` comes from the client and may be near INT64_MIN: then every start is in.
  int64_t lowest = std::numeric_limits<int64_t>::min();
  if (q.from > lowest + w.size_ms) lowest = q.from - w.size_ms + 1;
  if (a.stream_time >= 0) lowest = std::max(lowest, first_live_start(w, a.stream_time));
  auto snap = db_.read_snapshot(vid, {partition});
  auto pos = snap->position(vid, partition);
  if (!pos.ok()) return R::fail(failure_reason::store_exception, pos.error().to_string());
  a.pos.set(partition, pos.value().value_or(0));
  if (lowest >= q.to) return R::success(std::move(a));
  auto it = snap->scan(vid, partition, encode_windowed_key(q.key, lowest), encode_windowed_key(q.key, q.to), false,
                       storage::scan_use::page);
  std::size_t bytes = 0;
  for (; it->valid(); it->next()) {
    auto wk = decode_windowed_key(it->key());
    auto f = unframe_value(it->value());
    if (!wk || !f) return R::fail(failure_reason::store_exception, "stored window is malformed");
    bytes += f->value.size();
    if (bytes > q.max_bytes) {
      a.truncated = true;
      break;
    }
    a.windows.push_back(window_entry{wk->start, window_end(wk->start, w.size_ms), std::string(f->value), f->offset});
  }
  if (auto e = it->error(); !e.ok()) return R::fail(failure_reason::store_exception, e.to_string());
  return R::success(std::move(a));
}

query_result<window_answer> engine::sessions(const window_query& q, storage::view_id vid, int32_t partition,
                                             window_answer a) const {
  using R = query_result<window_answer>;
  const window_spec& w = *find_store(q.store)->window;
  const int64_t live = a.stream_time >= 0 ? first_live_last(w, a.stream_time) : std::numeric_limits<int64_t>::min();
  auto snap = db_.read_snapshot(vid, {partition});
  auto pos = snap->position(vid, partition);
  if (!pos.ok()) return R::fail(failure_reason::store_exception, pos.error().to_string());
  a.pos.set(partition, pos.value().value_or(0));
  if (q.from >= q.to) return R::success(std::move(a));
  std::size_t bytes = 0;
  enum class next { more, full, malformed };
  auto take = [&](std::string_view key, std::string_view value) {
    auto wk = decode_windowed_key(key);
    auto f = unframe_value(value);
    if (!wk || !f || !f->time) return next::malformed;
    const int64_t end = *session_end(f->time);
    if (end <= q.from || *f->time < live) return next::more;
    bytes += f->value.size();
    if (bytes > q.max_bytes) {
      a.truncated = true;
      return next::full;
    }
    a.windows.push_back(window_entry{wk->start, end, std::string(f->value), f->offset});
    return next::more;
  };
  // Live sessions of a key never overlap, so their starts and ends ascend together: the
  // one live session starting before `from` that may reach into [from, to) is the last
  // of them, found by a descending scan that steps over expired ones (kept on disk until
  // compaction, and no longer joined by new records); the others start in [from, to).
  const std::string from_key = encode_windowed_key(q.key, q.from);
  auto before = snap->scan(vid, partition, windowed_key_prefix(q.key), from_key, true, storage::scan_use::page);
  next n = next::more;
  for (; before->valid(); before->next()) {
    auto f = unframe_value(before->value());
    if (f && f->time && *f->time < live) continue;
    n = take(before->key(), before->value());
    break;
  }
  if (auto e = before->error(); !e.ok()) return R::fail(failure_reason::store_exception, e.to_string());
  if (n == next::more) {
    auto it = snap->scan(vid, partition, from_key, encode_windowed_key(q.key, q.to), false, storage::scan_use::page);
    for (; n == next::more && it->valid(); it->next()) n = take(it->key(), it->value());
    if (auto e = it->error(); !e.ok()) return R::fail(failure_reason::store_exception, e.to_string());
  }
  if (n == next::malformed) return R::fail(failure_reason::store_exception, "stored session is malformed");
  return R::success(std::move(a));
}

query_result<key_answer> engine::read_key(storage::view_id view, int32_t partition, std::string_view key,
                                          bool need_copy) const {
  using R = query_result<key_answer>;
  auto got = db_.get(view, partition, key);
  if (!got.ok()) return R::fail(failure_reason::store_exception, got.error().to_string());
  if (need_copy && !got->position) return R::fail(failure_reason::not_active, "no copy of this partition here");
  key_answer a;
  if (got->value) {
    auto f = unframe_value(*got->value);
    if (!f) return R::fail(failure_reason::store_exception, "stored value is shorter than its frame");
    a.offset = f->offset;
    // The record's bytes are the stored string minus its frame: shift them in place
    // rather than copy them into a new string.
    a.value = std::move(*got->value);
    a.value->erase(0, a.value->size() - f->value.size());
  }
  a.partition = partition;
  a.pos.set(partition, got->position.value_or(0));
  return R::success(std::move(a));
}

query_result<key_answer> engine::get_stale(const key_query& q) const {
  using R = query_result<key_answer>;
  const auto* view = find_store(q.store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + q.store + "'");
  auto vid = db_.find_view(view->name);
  if (!vid) return R::fail(failure_reason::store_exception, "store is not open");
  std::optional<int32_t> partition = q.partition;
  if (!partition) {
    auto loc = locate(q.store, q.key);
    if (!loc) return R::fail(failure_reason::not_up_to_date, "partition count not known yet");
    partition = loc->second;
  }
  if (q.as_of) {
    if (!view->versioned) return R::fail(failure_reason::store_exception, "store '" + q.store + "' is not versioned");
    return read_key_as_of(*vid, *partition, q.key, *q.as_of, true);
  }
  return read_key(*vid, *partition, q.key, true);
}

bool engine::has_copy(std::string_view store, int32_t partition) const {
  const auto* view = find_store(store);
  auto vid = view ? db_.find_view(view->name) : std::nullopt;
  if (!vid) return false;
  auto pos = db_.stored_position(*vid, partition);
  return pos.ok() && pos.value().has_value();
}

query_result<batch_answer> engine::get_many(std::string_view store,
                                            std::vector<std::pair<int32_t, std::string>> located,
                                            std::optional<int64_t> as_of) const {
  using R = query_result<batch_answer>;
  const auto* view = find_store(store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + std::string(store) + "'");
  auto vid = db_.find_view(view->name);
  if (!vid) return R::fail(failure_reason::store_exception, "store is not open");
  for (const auto& [p, k] : located)
    if (auto f = require_partition<batch_answer>(*view, p)) return *f;
  std::vector<int32_t> partitions;
  for (const auto& [p, k] : located)
    if (std::find(partitions.begin(), partitions.end(), p) == partitions.end()) partitions.push_back(p);
  auto snap = db_.read_snapshot(*vid, partitions);
  auto positions = snap->positions(*vid, partitions);
  if (!positions.ok()) return R::fail(failure_reason::store_exception, positions.error().to_string());
  batch_answer a;
  for (size_t i = 0; i < partitions.size(); ++i) a.pos.set(partitions[i], (*positions)[i].value_or(0));
  if (as_of) return get_many_as_of(*snap, view->name, *vid, located, partitions, *as_of, std::move(a));
  auto values = snap->multi_get(*vid, located);
  if (!values.ok()) return R::fail(failure_reason::store_exception, values.error().to_string());
  a.entries.reserve(located.size());
  for (size_t i = 0; i < located.size(); ++i) {
    batch_entry e{std::move(located[i].second), std::nullopt, -1, located[i].first};
    if (auto& stored = (*values)[i]) {
      auto f = unframe_value(*stored);
      if (!f) return R::fail(failure_reason::store_exception, "stored value is shorter than its frame");
      e.offset = f->offset;
      // The value is the end of the frame: cut the header off in place, no copy.
      const auto header = static_cast<std::size_t>(f->value.data() - stored->data());
      const auto size = f->value.size();
      stored->erase(0, header);
      stored->resize(size);
      e.value = std::move(*stored);
    }
    a.entries.push_back(std::move(e));
  }
  return R::success(std::move(a));
}

namespace {

// The smallest byte string greater than every string starting with `prefix`, or
// nullopt when there is none (the prefix is all 0xff bytes).
std::optional<std::string> prefix_successor(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = prefix.back();
    if (static_cast<unsigned char>(last) != 0xff) {
      last = static_cast<char>(static_cast<unsigned char>(last) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::nullopt;
}

void tighten_lower(std::optional<std::string>& lower, const std::string& candidate) {
  if (!lower || *lower < candidate) lower = candidate;
}
void tighten_upper(std::optional<std::string>& upper, const std::string& candidate) {
  if (!upper || candidate < *upper) upper = candidate;
}

class merged_range final : public range_stream {
 public:
  // With `as_of`, the keys and values as they were at that time (a versioned view).
  merged_range(std::shared_ptr<const storage::snapshot> snap, storage::view_id view,
               const std::vector<int32_t>& partitions, std::optional<std::string> lower,
               std::optional<std::string> upper, bool descending, storage::scan_use use, std::optional<int64_t> as_of)
      : snap_(std::move(snap)), descending_(descending), heap_(order{this}) {
    bool empty = lower && upper && !(*lower < *upper);
    for (int32_t p : partitions) {
      auto pos = snap_->position(view, p);
      if (!pos.ok()) {
        error_ = pos.error();
        return;
      }
      pos_.set(p, pos->value_or(0));
      if (empty) continue;
      if (as_of) {
        auto c = snap_->cursor_as_of(view, *as_of, descending, use);
        c->seek(p, lower, upper);
        its_.push_back(std::move(c));
      } else {
        its_.push_back(snap_->scan(view, p, lower, upper, descending, use));
      }
      parts_.push_back(p);
      if (its_.back()->valid()) heap_.push(its_.size() - 1);
      else if (!its_.back()->error().ok()) error_ = its_.back()->error();
    }
  }

  bool next(std::vector<range_entry>& out, size_t max) override {
    for (size_t n = 0; n < max; ++n) {
      if (!error_.ok() || heap_.empty()) return false;
      size_t i = heap_.top();
      heap_.pop();
      auto& it = *its_[i];
      auto f = unframe_value(it.value());
      if (!f) {
        error_ = status::corruption("stored value is shorter than its frame");
        return false;
      }
      out.push_back(range_entry{std::string(it.key()), std::string(f->value), f->offset, parts_[i], f->time});
      it.next();
      if (it.valid()) heap_.push(i);
      else if (!it.error().ok()) error_ = it.error();
    }
    return error_.ok() && !heap_.empty();
  }

  const position& pos() const override { return pos_; }
  status error() const override { return error_; }

 private:
  // Heap order: the iterator whose current key comes first in the iteration order is
  // on top. Keys are unique across partitions; partition breaks ties anyway.
  struct order {
    const merged_range* self;
    bool operator()(size_t a, size_t b) const {
      auto ka = self->its_[a]->key(), kb = self->its_[b]->key();
      int c = ka.compare(kb);
      if (c == 0) return self->parts_[a] > self->parts_[b];
      return self->descending_ ? c < 0 : c > 0;
    }
  };

  std::shared_ptr<const storage::snapshot> snap_;
  bool descending_;
  std::vector<std::unique_ptr<storage::partition_iterator>> its_;
  std::vector<int32_t> parts_;
  std::priority_queue<size_t, std::vector<size_t>, order> heap_;
  position pos_;
  status error_;
};

}  // namespace

query_result<engine::resolved_range> engine::resolve_range(const range_query& q, bool copies_allowed) const {
  using R = query_result<resolved_range>;
  const auto* view = find_store(q.store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + q.store + "'");
  auto vid = db_.find_view(view->name);
  if (!vid) return R::fail(failure_reason::store_exception, "store is not open");
  resolved_range r{*vid, {}, q.from, q.to, {}};
  if (q.partitions) {
    r.partitions = *q.partitions;
  } else if (copies_allowed && q.from_copies) {
    const int32_t count = ownership_.partition_count(view->topic);
    if (count <= 0)
      return R::fail(failure_reason::not_up_to_date, "partition count of '" + view->topic + "' not known yet");
    for (int32_t p = 0; p < count; ++p) r.partitions.push_back(p);
  } else {
    int32_t count = 0;
    if (auto f = require_all_partitions<resolved_range>(*view, count)) return std::move(*f);
    for (int32_t p = 0; p < count; ++p) r.partitions.push_back(p);
  }
  if (q.partitions || (copies_allowed && q.from_copies))
    for (int32_t p : r.partitions)
      if (auto f = require_partition<resolved_range>(*view, p)) {
        if (!copies_allowed || !q.from_copies) return std::move(*f);
        r.copies.push_back(p);
      }
  if (q.prefix) {
    tighten_lower(r.lower, *q.prefix);
    if (auto succ = prefix_successor(*q.prefix)) tighten_upper(r.upper, *succ);
  }
  if (q.after) {
    if (q.descending) tighten_upper(r.upper, *q.after);
    else tighten_lower(r.lower, *q.after + std::string(1, '\0'));  // the next key after `after`
  }
  return R::success(std::move(r));
}

query_result<std::unique_ptr<range_stream>> engine::open_range(const range_query& q, storage::scan_use use) const {
  using R = query_result<std::unique_ptr<range_stream>>;
  auto rr = resolve_range(q);
  if (!rr.ok()) return rr.as<std::unique_ptr<range_stream>>();
  auto& r = rr.answer();
  auto snap = db_.read_snapshot();
  if (q.as_of)
    if (auto f = check_history<std::unique_ptr<range_stream>>(*snap, q.store, r.view, r.partitions, *q.as_of))
      return std::move(*f);
  std::unique_ptr<range_stream> s = std::make_unique<merged_range>(std::move(snap), r.view, r.partitions, r.lower,
                                                                   r.upper, q.descending, use, q.as_of);
  if (!s->error().ok()) return R::fail(failure_reason::store_exception, s->error().to_string());
  return R::success(std::move(s));
}

// A page: the limit + 1 first entries of open_range(q) in its order (one more tells
// whether more exist), read with one cursor seeked to each partition in turn. Keys are
// spread evenly over partitions by the partitioner, so each partition is read in rounds
// of a quota near its expected share; a partition is read further only while its next
// key could still be among the limit + 1 kept. Few entries are read past the page, and
// a page costs one iterator instead of one per partition.
query_result<range_answer> engine::range(const range_query& q, size_t limit) const {
  using R = query_result<range_answer>;
  auto rr = resolve_range(q, true);
  if (!rr.ok()) return rr.as<range_answer>();
  const auto& r = rr.answer();
  auto snap = db_.read_snapshot(r.view, r.partitions);
  auto positions = snap->positions(r.view, r.partitions);
  if (!positions.ok()) return R::fail(failure_reason::store_exception, positions.error().to_string());
  range_answer a;
  for (size_t i = 0; i < r.partitions.size(); ++i) {
    const int32_t p = r.partitions[i];
    // A copy is a partition with a stored position: what was applied of it, atomically.
    if (!(*positions)[i] && std::find(r.copies.begin(), r.copies.end(), p) != r.copies.end())
      return R::fail(failure_reason::not_active, "no copy of partition " + std::to_string(p) + " here");
    a.pos.set(p, (*positions)[i].value_or(0));
  }
  a.stale = !r.copies.empty();
  if (q.as_of)
    if (auto f = check_history<range_answer>(*snap, q.store, r.view, r.partitions, *q.as_of)) return std::move(*f);
  if (r.partitions.empty() || (r.lower && r.upper && !(*r.lower < *r.upper))) return R::success(std::move(a));

  const bool desc = q.descending;
  // True when (key, partition) comes before (key2, partition2) in the iteration order.
  // Keys are unique across partitions; the lower partition comes first anyway, as in
  // open_range.
  auto first = [desc](std::string_view k1, int32_t p1, std::string_view k2, int32_t p2) {
    int c = k1.compare(k2);
    if (c == 0) return p1 < p2;
    return desc ? c > 0 : c < 0;
  };
  // The entries kept so far live in `slots`; a heap of their indices keeps the one that
  // comes last on top. An entry pushed out leaves its slot to the next one read, whose
  // key and value are copied into the strings' capacity: no allocation per entry read,
  // and the heap moves indices, not entries.
  std::vector<range_entry> slots;
  std::vector<uint32_t> heap, free_slots;
  auto before = [&](uint32_t x, uint32_t y) {
    return first(slots[x].key, slots[x].partition, slots[y].key, slots[y].partition);
  };
  const size_t keep = limit + 1;
  slots.reserve(std::min<size_t>(keep + 1, 1024));
  heap.reserve(std::min<size_t>(keep + 1, 1024));
  auto full = [&] { return heap.size() == keep; };
  auto top = [&]() -> const range_entry& { return slots[heap.front()]; };

  struct partition_read {
    int32_t partition;
    bool started = false, done = false;
    std::string next_key;  // the first key not read yet, once started
  };
  std::vector<partition_read> reads;
  reads.reserve(r.partitions.size());
  for (int32_t p : r.partitions) reads.push_back({p});
  const double share = static_cast<double>(keep) / static_cast<double>(r.partitions.size());
  auto quota = static_cast<size_t>(share + 2 * std::sqrt(share) + 2);

  auto cursor = q.as_of ? snap->cursor_as_of(r.view, *q.as_of, desc, storage::scan_use::page)
                        : snap->cursor(r.view, desc, storage::scan_use::page);
  for (bool pending = true; pending; quota *= 2) {
    pending = false;
    for (auto& pr : reads) {
      if (pr.done) continue;
      if (pr.started && full() && !first(pr.next_key, pr.partition, top().key, top().partition)) {
        pr.done = true;
        continue;
      }
      if (!pr.started) cursor->seek(pr.partition, r.lower, r.upper);
      else if (desc) cursor->seek(pr.partition, r.lower, pr.next_key + std::string(1, '\0'));  // next_key included
      else cursor->seek(pr.partition, pr.next_key, r.upper);
      pr.started = true;
      size_t n = 0;
      for (; cursor->valid() && n < quota; cursor->next(), ++n) {
        auto key = cursor->key();
        if (full() && !first(key, pr.partition, top().key, top().partition)) break;
        auto f = unframe_value(cursor->value());
        if (!f) return R::fail(failure_reason::store_exception, "stored value is shorter than its frame");
        uint32_t i = 0;
        if (!free_slots.empty()) {
          i = free_slots.back();
          free_slots.pop_back();
        } else {
          i = static_cast<uint32_t>(slots.size());
          slots.emplace_back();
        }
        range_entry& e = slots[i];
        e.key.assign(key.data(), key.size());
        e.value.assign(f->value.data(), f->value.size());
        e.offset = f->offset;
        e.partition = pr.partition;
        e.time = f->time;
        heap.push_back(i);
        std::push_heap(heap.begin(), heap.end(), before);
        if (heap.size() > keep) {
          std::pop_heap(heap.begin(), heap.end(), before);
          free_slots.push_back(heap.back());
          heap.pop_back();
        }
      }
      if (auto e = cursor->error(); !e.ok()) return R::fail(failure_reason::store_exception, e.to_string());
      if (n < quota || !cursor->valid()) {
        pr.done = true;  // the partition's end, or a key after every kept one
      } else {
        pr.next_key.assign(cursor->key());
        pending = true;
      }
    }
  }
  std::sort_heap(heap.begin(), heap.end(), before);
  if (heap.size() > limit) {
    heap.pop_back();
    a.more = true;
  }
  std::vector<range_entry> kept;
  kept.reserve(heap.size());
  for (uint32_t i : heap) kept.push_back(std::move(slots[i]));
  a.entries = std::move(kept);
  return R::success(std::move(a));
}

query_result<window_range_answer> engine::window_range(const window_range_query& q, size_t limit) const {
  using R = query_result<window_range_answer>;
  const auto* view = find_store(q.range.store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + q.range.store + "'");
  if (!view->window) return R::fail(failure_reason::store_exception, "store '" + q.range.store + "' is not windowed");
  const window_spec& w = *view->window;
  // Group keys in [from, to) are stored keys in [prefix(from), prefix(to)) (core/window.h).
  range_query stored = q.range;
  stored.prefix.reset();
  stored.descending = false;
  if (stored.from) stored.from = windowed_key_prefix(*stored.from);
  if (stored.to) stored.to = windowed_key_prefix(*stored.to);
  auto opened = open_range(stored, storage::scan_use::page);
  if (!opened.ok()) return opened.as<window_range_answer>();
  auto& s = *opened.answer();

  // Stream time of each partition, read once per page.
  std::map<int32_t, int64_t> stream_time;
  auto live_from = [&](int32_t p) -> result<int64_t> {
    auto it = stream_time.find(p);
    if (it == stream_time.end()) {
      auto st = db_.stored_named_position(stream_time_position_name(*view), p);
      if (!st.ok()) return st.error();
      it = stream_time.emplace(p, st.value().value_or(-1)).first;
    }
    if (it->second < 0) return std::numeric_limits<int64_t>::min();
    return is_session(w) ? first_live_last(w, it->second) : first_live_start(w, it->second);
  };

  window_range_answer a;
  std::vector<range_entry> batch;
  bool more = true;
  while (more && a.entries.size() <= limit) {
    batch.clear();
    more = s.next(batch, 256);
    for (auto& e : batch) {
      auto wk = decode_windowed_key(e.key);
      if (!wk) return R::fail(failure_reason::store_exception, "stored window key is malformed");
      auto live = live_from(e.partition);
      if (!live.ok()) return R::fail(failure_reason::store_exception, live.error().to_string());
      // A session ends after its last record time, which its frame holds; it expires
      // by that end (core/window.h).
      const bool session = is_session(w);
      if (session && !e.time) return R::fail(failure_reason::store_exception, "stored session is malformed");
      const int64_t end = session ? *session_end(e.time) : window_end(wk->start, w.size_ms);
      if (wk->start >= q.to || end <= q.from || (session ? *e.time : wk->start) < *live) continue;
      a.entries.push_back(window_range_entry{std::move(e.key), std::move(wk->key),
                                             window_entry{wk->start, end, std::move(e.value), e.offset}, e.partition});
      if (a.entries.size() > limit) break;  // one more than asked tells whether more exist
    }
  }
  if (!s.error().ok()) return R::fail(failure_reason::store_exception, s.error().to_string());
  if (a.entries.size() > limit) {
    a.entries.resize(limit);
    a.more = true;
  }
  a.pos = s.pos();
  return R::success(std::move(a));
}

query_result<count_answer> engine::count(std::string_view store, uint64_t exact_limit,
                                         const std::optional<std::vector<int32_t>>& subset,
                                         std::optional<int64_t> as_of) const {
  using R = query_result<count_answer>;
  const auto* view = find_store(store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + std::string(store) + "'");
  auto vid = db_.find_view(view->name);
  if (!vid) return R::fail(failure_reason::store_exception, "store is not open");
  int32_t total = 0;
  std::vector<int32_t> parts;
  if (subset) {
    total = ownership_.partition_count(view->topic);
    for (int32_t p : *subset)
      if (auto f = require_partition<count_answer>(*view, p)) return *f;
    parts = *subset;
  } else {
    if (auto f = require_all_partitions<count_answer>(*view, total)) return *f;
    for (int32_t p = 0; p < total; ++p) parts.push_back(p);
  }
  auto stats = db_.stats(*vid);
  if (!stats.ok()) return R::fail(failure_reason::store_exception, stats.error().to_string());
  count_answer a;
  auto snap = db_.read_snapshot(*vid, parts);
  for (int32_t p : parts) {
    auto pos = snap->position(*vid, p);
    if (!pos.ok()) return R::fail(failure_reason::store_exception, pos.error().to_string());
    a.pos.set(p, pos->value_or(0));
  }
  if (as_of) {
    // What was valid at a past time has no estimate: only a scan tells, and the limit
    // of an exact count bounds it.
    if (stats->estimated_keys > exact_limit)
      return R::fail(failure_reason::too_many_keys,
                     "store '" + view->name + "' holds about " + std::to_string(stats->estimated_keys) +
                         " keys, more than an exact count reads (" + std::to_string(exact_limit) +
                         "); counting as of a time needs an exact count");
    return count_as_of(*snap, view->name, *vid, parts, *as_of, std::move(a));
  }
  if (stats->estimated_keys > exact_limit) {
    // RocksDB estimates the whole column family; a part answers its share.
    a.count = total > 0 ? stats->estimated_keys * parts.size() / static_cast<uint64_t>(total) : 0;
    a.exact = false;
    return R::success(std::move(a));
  }
  for (int32_t p : parts) {
    auto it = snap->scan(*vid, p, std::nullopt, std::nullopt, false, storage::scan_use::sweep);
    for (; it->valid(); it->next()) ++a.count;
    if (!it->error().ok()) return R::fail(failure_reason::store_exception, it->error().to_string());
  }
  a.exact = true;
  return R::success(std::move(a));
}

query_result<position> engine::current_position(std::string_view store) const {
  using R = query_result<position>;
  const auto* view = find_store(store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + std::string(store) + "'");
  auto vid = db_.find_view(view->name);
  if (!vid) return R::fail(failure_reason::store_exception, "store is not open");
  position out;
  auto t = ownership_.topic(view->topic);
  if (!t) return R::success(std::move(out));
  auto snap = db_.read_snapshot();
  for (const auto& [p, st] : t->partitions) {
    if (!st.assigned) continue;
    auto pos = snap->position(*vid, p);
    if (!pos.ok()) return R::fail(failure_reason::store_exception, pos.error().to_string());
    out.set(p, pos->value_or(0));
  }
  return R::success(std::move(out));
}

query_result<bool> engine::reached(std::string_view store, const position& bound) const {
  using R = query_result<bool>;
  const auto* view = find_store(store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + std::string(store) + "'");
  auto vid = db_.find_view(view->name);
  if (!vid) return R::fail(failure_reason::store_exception, "store is not open");
  auto snap = db_.read_snapshot();
  for (const auto& [p, offset] : bound) {
    if (auto f = require_partition<bool>(*view, p)) {
      // A partition still catching up may reach the bound; one not held here never will.
      if (f->failure() == failure_reason::not_active) return *f;
    }
    auto pos = snap->position(*vid, p);
    if (!pos.ok()) return R::fail(failure_reason::store_exception, pos.error().to_string());
    if (pos->value_or(0) <= offset) return R::success(false);
  }
  return R::success(true);
}

query_result<store_info> engine::describe(std::string_view store) const {
  using R = query_result<store_info>;
  const auto* view = find_store(store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + std::string(store) + "'");
  auto vid = db_.find_view(view->name);
  if (!vid) return R::fail(failure_reason::store_exception, "store is not open");
  store_info info{view, ownership_.partition_count(view->topic), {}, {}};
  if (auto t = ownership_.topic(view->topic)) {
    auto snap = db_.read_snapshot();
    for (const auto& [p, st] : t->partitions) {
      if (!st.assigned) continue;
      auto pos = snap->position(*vid, p);
      info.partitions.push_back(
          partition_info{p, st.assigned, st.ready, pos.ok() ? pos.value() : std::nullopt, st.catch_up_target});
    }
  }
  if (auto s = db_.stats(*vid); s.ok()) info.stats = *s;
  return R::success(std::move(info));
}

}  // namespace kstate::query
