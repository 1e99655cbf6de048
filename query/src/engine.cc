#include "query/engine.h"

#include "core/value_codec.h"

namespace kstate::query {

const char* to_string(failure_reason r) noexcept {
  switch (r) {
    case failure_reason::unknown_query_store: return "UNKNOWN_QUERY_STORE";
    case failure_reason::not_active: return "NOT_ACTIVE";
    case failure_reason::not_up_to_date: return "NOT_UP_TO_DATE";
    case failure_reason::store_exception: return "STORE_EXCEPTION";
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

query_result<key_answer> engine::get(const key_query& q) const {
  using R = query_result<key_answer>;
  const auto* view = find_store(q.store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + q.store + "'");
  auto vid = db_.find_view(view->name);
  auto part_fn = partitioners_.find(view->name);
  if (!vid || part_fn == partitioners_.end())
    return R::fail(failure_reason::store_exception, "store '" + q.store + "' is not open");

  int32_t count = ownership_.partition_count(view->topic);
  if (count <= 0) return R::fail(failure_reason::not_up_to_date, "partition count of '" + view->topic + "' not known yet");
  int32_t partition = part_fn->second(q.key, count);

  auto topic = ownership_.topic(view->topic);
  const partition_state* ps = nullptr;
  if (topic) {
    auto it = topic->partitions.find(partition);
    if (it != topic->partitions.end()) ps = &it->second;
  }
  if (!ps || !ps->assigned)
    return R::fail(failure_reason::not_active, "partition " + std::to_string(partition) + " of '" + view->topic +
                                                   "' is not assigned to this instance");
  if (!ps->ready)
    return R::fail(failure_reason::not_up_to_date, "partition " + std::to_string(partition) + " of '" + view->topic +
                                                       "' is catching up");

  auto got = db_.get(*vid, partition, q.key);
  if (!got.ok()) return R::fail(failure_reason::store_exception, got.error().to_string());
  key_answer a;
  if (got->value) {
    auto f = unframe_value(*got->value);
    if (!f) return R::fail(failure_reason::store_exception, "stored value is shorter than its frame");
    a.value = std::string(f->value);
    a.offset = f->offset;
  }
  a.partition = partition;
  a.pos[partition] = got->position.value_or(0);
  return R::success(std::move(a));
}

query_result<store_info> engine::describe(std::string_view store) const {
  using R = query_result<store_info>;
  const auto* view = find_store(store);
  if (!view) return R::fail(failure_reason::unknown_query_store, "no store named '" + std::string(store) + "'");
  auto vid = db_.find_view(view->name);
  if (!vid) return R::fail(failure_reason::store_exception, "store is not open");
  store_info info{view, ownership_.partition_count(view->topic), {}, {}};
  if (auto t = ownership_.topic(view->topic)) {
    for (const auto& [p, st] : t->partitions) {
      if (!st.assigned) continue;
      auto pos = db_.stored_position(*vid, p);
      info.partitions.push_back(partition_info{p, st.assigned, st.ready,
                                               pos.ok() ? pos.value() : std::nullopt, st.catch_up_target});
    }
  }
  if (auto s = db_.stats(*vid); s.ok()) info.stats = *s;
  return R::success(std::move(info));
}

}  // namespace kstate::query
