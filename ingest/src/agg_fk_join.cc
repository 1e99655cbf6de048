// The aggregate pipeline's foreign-key joins (docs/fk-joins.md). Stage 1 (agg_join.cc)
// copies each left record to the view's repartition topic and each right record to its
// subscription topic, both in the partition of the same number. Here, stage 2 of each:
// the left side keeps a row per left key and sends subscriptions to the partition of
// the right topic that holds the foreign key; the right side keeps each foreign key's
// right value and subscriptions and sends answers back. Every record sent, and both
// sides' changelog records, belong to the batch's transaction.
#include "agg_pipeline.h"

#include "kafka_common.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>

#include "core/value_codec.h"

namespace kstate::ingest {
namespace {

// The counter's reason for a left value that refers to no right key (a fixed set).
const char* unmatched_reason(const std::string& why) {
  if (why.find("not JSON") != std::string::npos) return "not_json";
  if (why.find("missing") != std::string::npos) return "missing";
  return "not_a_key";
}

}  // namespace

status agg_pipeline::fk_left_stage2(view_state& v, const record& r) {
  const auto& def = *v.def;
  // The repartition topic is written by stage 1 and the right sides, but readable and
  // writable by anyone: every record is checked again.
  std::optional<join_input> copy;
  std::optional<fk_message> response;
  if (r.value && !r.value->empty() && r.value->front() == fk_response_marker) {
    response = decode_fk_message(*r.value);
    if (!response || response->kind != fk_message_kind::response) {
      builder_.reject(def, r, "not a foreign-key join response (undecodable)");
      return status::ok_status();
    }
  } else {
    copy = decode_join_input(r.value);
    if (!copy || copy->side != join_side::left) {
      builder_.reject(def, r, "not a foreign-key join input record (no left marker)");
      return status::ok_status();
    }
    record unmarked = r;
    unmarked.value = copy->value;
    if (auto why = validate(def, unmarked, cfg_.max_json_depth); !why.empty()) {
      builder_.reject(def, r, std::move(why));
      return status::ok_status();
    }
  }
  std::string key(*r.key);
  auto current_state = join_state(v, r.partition, key);
  if (!current_state.ok()) return current_state.error();
  const std::string& current = current_state.value();
  fk_left_row row;
  if (!current.empty()) {
    auto decoded = decode_fk_left_row(current);
    if (!decoded) return status::corruption("store " + def.name + ": undecodable foreign-key join row");
    row = std::move(*decoded);
  }
  if (response) {
    // An answer for a subscription the row has left (a change of foreign key since):
    // dropped, so the row never shows a right value of a key it no longer names.
    if (!fk_apply_response(row, response->version, response->value)) return status::ok_status();
  } else {
    std::optional<std::string> fk;
    if (copy->value) {
      std::string why;
      fk = foreign_key_of(*copy->value, def.join->foreign_key, def.key_format, cfg_.max_json_depth, &why);
      if (!fk && m_unmatched_) m_unmatched_->Add({{"store", def.name}, {"reason", unmatched_reason(why)}}).Increment();
    }
    // The version of a subscription is this record's repartition offset: it grows with
    // every left record of the key, so the right side and this side tell old from new.
    auto step = fk_apply_left(std::move(row), key, r.partition, copy->value, std::move(fk), r.offset);
    const int32_t right_count = ownership_.partition_count(def.join->subscription_topic);
    for (const auto& out : step.send) {
      const int32_t q = (*v.fk_route)(out.key, right_count);
      auto s = produce(def.join->subscription_topic, q, out.key, encode_fk_message(out.message), -1, r.timestamp);
      if (!s.ok()) log()->error("{}", s.message());
    }
    row = std::move(step.row);
  }
  set_join_state(v, r, std::move(key), row.empty() ? std::string() : encode_fk_left_row(row));
  return status::ok_status();
}

result<std::optional<std::string>> agg_pipeline::fk_entry(view_state& v, int32_t q, const std::string& key) {
  const size_t idx = static_cast<size_t>(&v - views_.data());
  if (auto c = cache_.find({idx, q, key}); c != cache_.end())
    return c->second.deleted ? std::optional<std::string>() : std::optional<std::string>(c->second.state);
  if (auto u = unwritten_.find({idx, q, key}); u != unwritten_.end())
    return u->second.deleted ? std::optional<std::string>() : std::optional<std::string>(u->second.state);
  auto got = db_.get(v.id, q, key);
  if (!got.ok()) return got.error().prefixed("reading the right side of store " + views_[*v.right_of].def->name);
  return std::move(got.value().value);
}

void agg_pipeline::fk_set(view_state& v, const record& r, const std::string& key, std::optional<std::string> value) {
  const size_t idx = static_cast<size_t>(&v - views_.data());
  auto& c = cache_[{idx, r.partition, key}];
  c.deleted = !value;
  c.state = value ? std::move(*value) : std::string();
  c.input_offset = r.offset;
  c.timestamp = r.timestamp;
  c.dirty = true;
  if (!v.def->cache) {
    auto s = produce_changelog(v, r.partition, key, c);
    if (!s.ok()) log()->error("{}", s.message());
  }
}

result<std::vector<std::pair<std::string, fk_subscription>>> agg_pipeline::fk_subscribers(view_state& v, int32_t q,
                                                                                          const std::string& fk) {
  const size_t idx = static_cast<size_t>(&v - views_.data());
  const std::string prefix = fk_subscription_prefix(fk);
  auto under = [&](std::string_view k) {
    return k.size() >= prefix.size() && k.compare(0, prefix.size(), prefix) == 0;
  };
  // Stored key -> value (nullopt: deleted since), newest layer last.
  std::map<std::string, std::optional<std::string>> entries;
  auto snap = db_.read_snapshot();
  auto it = snap->scan(v.id, q, prefix, std::nullopt, false, storage::scan_use::page);
  for (; it->valid() && under(it->key()); it->next()) entries[std::string(it->key())] = std::string(it->value());
  if (auto s = it->error(); !s.ok()) return s.prefixed("reading the subscriptions of store " + v.def->name);
  for (auto u = unwritten_.lower_bound({idx, q, prefix}); u != unwritten_.end() && std::get<0>(u->first) == idx &&
                                                          std::get<1>(u->first) == q && under(std::get<2>(u->first));
       ++u)
    entries[std::get<2>(u->first)] =
        u->second.deleted ? std::optional<std::string>() : std::optional<std::string>(u->second.state);
  for (auto c = cache_.lower_bound({idx, q, prefix});
       c != cache_.end() && std::get<0>(c->first) == idx && std::get<1>(c->first) == q && under(std::get<2>(c->first));
       ++c)
    entries[std::get<2>(c->first)] =
        c->second.deleted ? std::optional<std::string>() : std::optional<std::string>(c->second.state);
  std::vector<std::pair<std::string, fk_subscription>> out;
  for (const auto& [k, value] : entries) {
    if (!value) continue;
    auto sub = decode_fk_subscription(*value);
    if (!sub) return status::corruption("store " + v.def->name + ": undecodable subscription");
    out.emplace_back(k.substr(prefix.size()), *sub);
  }
  return out;
}

status agg_pipeline::fk_right_stage2(view_state& v, const record& r) {
  auto& join_view = views_[*v.right_of];
  const auto& def = *join_view.def;
  std::optional<fk_message> msg;
  if (r.value) msg = decode_fk_message(*r.value);
  if (!msg || msg->kind == fk_message_kind::response || !r.key) {
    builder_.reject(def, r, "not a foreign-key join subscription record (undecodable)");
    return status::ok_status();
  }
  const std::string fk(*r.key);
  const int32_t left_count = ownership_.partition_count(def.topic);
  auto answer = [&](const std::string& left_key, const fk_subscription& sub, const std::optional<std::string>& right) {
    auto resp = fk_answer(left_key, sub, right);
    auto s = produce(def.topic, resp.left_partition, resp.left_key, encode_fk_message(resp.message), -1, r.timestamp);
    if (!s.ok()) log()->error("{}", s.message());
  };
  switch (msg->kind) {
    case fk_message_kind::right: {
      if (msg->value) {
        record unmarked = r;
        unmarked.value = *msg->value;
        if (auto why = validate(def, unmarked, cfg_.max_json_depth); !why.empty()) {
          builder_.reject(def, r, std::move(why));
          return status::ok_status();
        }
      }
      fk_set(v, r, fk_right_key(fk), msg->value);
      // Every left key that names this key learns its new value (the fan-out of a
      // popular key is the number of its left rows).
      auto subs = fk_subscribers(v, r.partition, fk);
      if (!subs.ok()) return subs.error();
      for (const auto& [left_key, sub] : subs.value()) answer(left_key, sub, msg->value);
      break;
    }
    case fk_message_kind::subscribe: {
      if (msg->left_partition < 0 || msg->left_partition >= left_count) {
        builder_.reject(def, r,
                        "subscription names left partition " + std::to_string(msg->left_partition) + " of " +
                            std::to_string(left_count));
        return status::ok_status();
      }
      const std::string sub_key = fk_subscription_prefix(fk) + msg->left_key;
      auto existing = fk_entry(v, r.partition, sub_key);
      if (!existing.ok()) return existing.error();
      std::optional<fk_subscription> had;
      if (existing.value()) had = decode_fk_subscription(*existing.value());
      auto kept = fk_apply_subscribe(had, *msg);
      if (!kept) break;  // a replay of a subscription already kept (and answered)
      fk_set(v, r, sub_key, encode_fk_subscription(*kept));
      auto right = fk_entry(v, r.partition, fk_right_key(fk));
      if (!right.ok()) return right.error();
      answer(msg->left_key, *kept, right.value());
      break;
    }
    case fk_message_kind::unsubscribe: {
      const std::string sub_key = fk_subscription_prefix(fk) + msg->left_key;
      auto existing = fk_entry(v, r.partition, sub_key);
      if (!existing.ok()) return existing.error();
      std::optional<fk_subscription> had;
      if (existing.value()) had = decode_fk_subscription(*existing.value());
      if (fk_unsubscribe_removes(had, *msg)) fk_set(v, r, sub_key, std::nullopt);
      break;
    }
    case fk_message_kind::response: break;  // refused above
  }
  builder_.note_applied(def.name, r.topic, r.partition);
  return status::ok_status();
}

void agg_pipeline::fk_left_write(storage::write_batch& batch, const view_state& v, int32_t partition,
                                 std::string_view key, std::string_view row, int64_t input_offset) {
  write_fk_left_row(batch, target(v), partition, key, row, input_offset);
}

}  // namespace kstate::ingest
