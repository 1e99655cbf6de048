// The aggregate pipeline's join views (docs/configuration.md#join-views): stage 1 copies
// each record of either input, marked with its side, into the view's repartition topic
// in the partition of the same number, so that one partition of it holds both sides of
// every key whatever instance owns which input partition; stage 2 keeps each key's
// latest value of both sides and writes the joined value.
#include "agg_pipeline.h"

#include "changelog_apply.h"
#include "kafka_common.h"

namespace kstate::ingest {

void agg_pipeline::join_stage1(view_state& v, const record& r) {
  const auto& def = *v.def;
  if (auto why = validate(def, r, cfg_.max_json_depth); !why.empty()) {
    builder_.reject(def, r, std::move(why));
    return;
  }
  const size_t idx = static_cast<size_t>(&v - views_.data());
  // A self-join (both inputs one topic) sets both sides.
  for (auto side : {join_side::left, join_side::right}) {
    const auto& topic = side == join_side::left ? def.input_topic() : def.join->right_topic;
    if (r.topic != topic) continue;
    // Only a key's latest value of a side matters: the batch's last one is enough.
    auto& pending = join_partials_[std::make_tuple(idx, r.partition, std::string(*r.key), side)];
    pending.value = r.value ? std::optional<std::string>(std::string(*r.value)) : std::nullopt;
    pending.timestamp = r.timestamp;
  }
}

status agg_pipeline::join_stage2(view_state& v, const record& r) {
  const auto& def = *v.def;
  // The repartition topic is written by stage 1 but readable by anyone: checked again.
  auto in = decode_join_input(r.value);
  if (!in) {
    builder_.reject(def, r, "not a join input record (no side marker)");
    return status::ok_status();
  }
  record unmarked = r;
  unmarked.value = in->value;
  if (auto why = validate(def, unmarked, cfg_.max_json_depth); !why.empty()) {
    builder_.reject(def, r, std::move(why));
    return status::ok_status();
  }
  std::string key(*r.key);
  auto current = join_state(v, r.partition, key);
  if (!current.ok()) return current.error();
  join_sides sides;
  if (!current.value().empty()) {
    auto decoded = decode_sides(current.value());
    if (!decoded) return status::corruption("store " + def.name + ": undecodable sides of a key");
    sides = std::move(*decoded);
  }
  sides.of(in->side) = in->value ? std::optional<std::string>(std::string(*in->value)) : std::nullopt;
  set_join_state(v, r, std::move(key), encode_sides(sides));
  return status::ok_status();
}

result<std::string> agg_pipeline::join_state(view_state& v, int32_t partition, const std::string& key) {
  const size_t idx = static_cast<size_t>(&v - views_.data());
  if (auto slot = cache_.find({idx, partition, key}); slot != cache_.end()) return slot->second.state;
  if (auto u = unwritten_.find({idx, partition, key}); u != unwritten_.end()) return u->second.state;
  auto got = db_.get(*v.sides, partition, key);
  if (!got.ok()) return got.error().prefixed("reading the sides of store " + v.def->name);
  return got.value().value ? std::move(*got.value().value) : std::string();
}

void agg_pipeline::set_join_state(view_state& v, const record& r, std::string key, std::string state) {
  const size_t idx = static_cast<size_t>(&v - views_.data());
  auto& c = cache_[std::make_tuple(idx, r.partition, key)];
  c.state = std::move(state);
  c.input_offset = r.offset;
  c.timestamp = r.timestamp;
  c.dirty = true;
  builder_.note_applied(v.def->name, r.topic, r.partition);
  if (!v.def->cache) {
    auto s = produce(v.def->changelog_topic, r.partition, key, changelog_value(v, c.state), r.offset, r.timestamp);
    if (!s.ok()) log()->error("{}", s.message());
  }
}

std::optional<std::string_view> agg_pipeline::changelog_value(const view_state& v, const std::string& state) const {
  if ((v.join || v.right_of) && state.empty()) return std::nullopt;
  return std::string_view(state);
}

void agg_pipeline::join_write(storage::write_batch& batch, const view_state& v, int32_t partition, std::string_view key,
                              std::string_view sides, int64_t input_offset) {
  write_join_sides(batch, target(v), partition, key, sides, input_offset);
}

status agg_pipeline::check_join_topics(const std::map<std::string, int32_t>& counts) const {
  for (const auto& vs : views_) {
    const auto& v = *vs.def;
    if (!v.is_join() || vs.right_of) continue;
    const int32_t left = ownership_.partition_count(v.input_topic());
    const int32_t right = ownership_.partition_count(v.join->right_topic);
    if (right <= 0) return status::not_found("topic '" + v.join->right_topic + "' does not exist");
    if (v.is_fk_join()) {
      // The internal topics keep their inputs' partitions (a copy goes to the partition
      // of the same number); the inputs need not be co-partitioned.
      for (const auto& [topic, want, input] : {std::make_tuple(v.topic, left, v.input_topic()),
                                               std::make_tuple(v.join->subscription_topic, right, v.join->right_topic)})
        if (auto it = counts.find(topic); it != counts.end() && it->second != want)
          return status::invalid_argument("join view '" + v.name + "': topic '" + topic + "' has " +
                                          std::to_string(it->second) + " partitions, topic '" + input + "' has " +
                                          std::to_string(want) + " (delete it, or keep the input's partition count)");
      continue;
    }
    if (left != right)
      return status::invalid_argument("join view '" + v.name + "': its inputs are not co-partitioned: topic '" +
                                      v.input_topic() + "' has " + std::to_string(left) + " partitions, topic '" +
                                      v.join->right_topic + "' has " + std::to_string(right) +
                                      " (a join needs the same partition count and partitioner on both inputs)");
    if (auto it = counts.find(v.topic); it != counts.end() && it->second != left)
      return status::invalid_argument("join view '" + v.name + "': repartition topic '" + v.topic + "' has " +
                                      std::to_string(it->second) + " partitions, its inputs " + std::to_string(left) +
                                      " (delete it, or keep the inputs' partition count)");
  }
  return status::ok_status();
}

}  // namespace kstate::ingest
