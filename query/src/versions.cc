// The engine's reads of versioned stores: a key as of a time, and a key's versions.

#include <algorithm>
#include <limits>

#include "core/value_codec.h"
#include "query/engine.h"

namespace kstate::query {

namespace {

std::string before_history(int32_t partition, int64_t start) {
  return "partition " + std::to_string(partition) + " keeps versions from " + std::to_string(start) +
         " (its stream time minus the store's history) on; what was valid before is not known";
}

}  // namespace

template <typename T>
std::optional<query_result<T>> engine::check_history(const storage::snapshot& snap, const std::string& store,
                                                     storage::view_id view, const std::vector<int32_t>& partitions,
                                                     int64_t as_of) const {
  using R = query_result<T>;
  const auto* def = find_store(store);
  if (!def || !def->versioned)
    return R::fail(failure_reason::store_exception, "store '" + store + "' is not versioned");
  for (int32_t p : partitions) {
    auto start = snap.history_start(view, p);
    if (!start.ok()) return R::fail(failure_reason::store_exception, start.error().to_string());
    if (*start && as_of < **start) return R::fail(failure_reason::history_unavailable, before_history(p, **start));
  }
  return std::nullopt;
}

template std::optional<query_result<range_answer>> engine::check_history<range_answer>(
    const storage::snapshot&, const std::string&, storage::view_id, const std::vector<int32_t>&, int64_t) const;
template std::optional<query_result<std::unique_ptr<range_stream>>>
engine::check_history<std::unique_ptr<range_stream>>(const storage::snapshot&, const std::string&, storage::view_id,
                                                     const std::vector<int32_t>&, int64_t) const;

query_result<batch_answer> engine::get_many_as_of(const storage::snapshot& snap, const std::string& store,
                                                  storage::view_id view,
                                                  const std::vector<std::pair<int32_t, std::string>>& located,
                                                  const std::vector<int32_t>& partitions, int64_t as_of,
                                                  batch_answer a) const {
  using R = query_result<batch_answer>;
  if (auto f = check_history<batch_answer>(snap, store, view, partitions, as_of)) return std::move(*f);
  a.entries.reserve(located.size());
  for (const auto& [p, k] : located) {
    batch_entry e{k, std::nullopt, -1, p};
    auto got = snap.version_at(view, p, k, as_of);
    if (!got.ok()) return R::fail(failure_reason::store_exception, got.error().to_string());
    // No version valid then, or a tombstone: absent, as a missing key.
    if (*got && (*got)->value) {
      auto f = unframe_value(*(*got)->value);
      if (!f) return R::fail(failure_reason::store_exception, "stored version is shorter than its frame");
      e.value = std::string(f->value);
      e.offset = f->offset;
    }
    a.entries.push_back(std::move(e));
  }
  return R::success(std::move(a));
}

query_result<count_answer> engine::count_as_of(const storage::snapshot& snap, const std::string& store,
                                               storage::view_id view, const std::vector<int32_t>& partitions,
                                               int64_t as_of, count_answer a) const {
  using R = query_result<count_answer>;
  if (auto f = check_history<count_answer>(snap, store, view, partitions, as_of)) return std::move(*f);
  // The cursor skips keys whose version then was a tombstone, and keys without one.
  auto c = snap.cursor_as_of(view, as_of, false, storage::scan_use::sweep);
  for (int32_t p : partitions) {
    c->seek(p, std::nullopt, std::nullopt);
    for (; c->valid(); c->next()) ++a.count;
    if (auto e = c->error(); !e.ok()) return R::fail(failure_reason::store_exception, e.to_string());
  }
  a.exact = true;
  return R::success(std::move(a));
}

query_result<key_answer> engine::read_key_as_of(storage::view_id view, int32_t partition, std::string_view key,
                                                int64_t as_of, bool need_copy) const {
  using R = query_result<key_answer>;
  auto snap = db_.read_snapshot();
  auto pos = snap->position(view, partition);
  if (!pos.ok()) return R::fail(failure_reason::store_exception, pos.error().to_string());
  if (need_copy && !*pos) return R::fail(failure_reason::not_active, "no copy of this partition here");
  auto start = snap->history_start(view, partition);
  if (!start.ok()) return R::fail(failure_reason::store_exception, start.error().to_string());
  if (*start && as_of < **start)
    return R::fail(failure_reason::history_unavailable, before_history(partition, **start));
  auto got = snap->version_at(view, partition, key, as_of);
  if (!got.ok()) return R::fail(failure_reason::store_exception, got.error().to_string());
  key_answer a;
  a.partition = partition;
  a.pos.set(partition, pos->value_or(0));
  if (!*got) return R::success(std::move(a));
  const storage::version& v = **got;
  a.valid_from = v.valid_from;
  a.valid_to = v.valid_to;
  if (v.value) {
    auto f = unframe_value(*v.value);
    if (!f) return R::fail(failure_reason::store_exception, "stored version is shorter than its frame");
    a.offset = f->offset;
    a.value = std::string(f->value);
  }
  return R::success(std::move(a));
}

query_result<version_answer> engine::versions(const version_query& q) const {
  using R = query_result<version_answer>;
  const view_def* view = nullptr;
  storage::view_id vid = 0;
  int32_t partition = -1;
  if (auto f = held_key_partition<version_answer>(q.store, q.key, q.partition, view, vid, partition)) return *f;
  if (!view->versioned) return R::fail(failure_reason::store_exception, "store '" + q.store + "' is not versioned");
  auto snap = db_.read_snapshot();
  version_answer a;
  a.partition = partition;
  auto pos = snap->position(vid, partition);
  if (!pos.ok()) return R::fail(failure_reason::store_exception, pos.error().to_string());
  a.pos.set(partition, pos->value_or(0));
  auto start = snap->history_start(vid, partition);
  if (!start.ok()) return R::fail(failure_reason::store_exception, start.error().to_string());
  a.history_start = *start;
  const int64_t not_before = start->value_or(std::numeric_limits<int64_t>::min());
  if (*start && q.to <= **start)
    return R::fail(failure_reason::history_unavailable, before_history(partition, **start));
  // One more than the limit tells whether more exist.
  auto got = snap->versions(vid, partition, q.key, q.from, q.to, not_before, q.limit + 1);
  if (!got.ok()) return R::fail(failure_reason::store_exception, got.error().to_string());
  if (got->size() > q.limit) {
    got->pop_back();
    a.more = true;
  }
  a.versions.reserve(got->size());
  for (auto& v : *got) {
    version_entry e{v.valid_from, v.valid_to, std::nullopt, v.offset};
    if (v.value) {
      auto f = unframe_value(*v.value);
      if (!f) return R::fail(failure_reason::store_exception, "stored version is shorter than its frame");
      e.value = std::string(f->value);
    }
    a.versions.push_back(std::move(e));
  }
  return R::success(std::move(a));
}

}  // namespace kstate::query
