#include "changelog_apply.h"

#include "agg_pipeline.h"
#include "kafka_common.h"

#include "core/value_codec.h"
#include "ingest/fk_join.h"

namespace kstate::ingest {

void write_join_sides(storage::write_batch& batch, const changelog_target& t, int32_t partition, std::string_view key,
                      std::string_view sides, int64_t input_offset) {
  std::optional<join_sides> decoded;
  if (!sides.empty()) decoded = decode_sides(sides);
  if (!decoded) {
    // No sides (a tombstone), or a changelog record that is not sides (written by
    // something else): the key has no row.
    if (!sides.empty())
      log()->warn("store {}: changelog record of partition {} is not a join's sides; key deleted", t.def->name,
                  partition);
    batch.del(*t.sides, partition, key);
    batch.del(t.id, partition, key);
    return;
  }
  batch.put(*t.sides, partition, key, sides);
  if (auto joined = t.join->joined(*decoded)) batch.put(t.id, partition, key, frame_value(input_offset, *joined));
  else batch.del(t.id, partition, key);
}

view_def fk_right_view(const view_def& join) {
  view_def right = join;
  right.name = fk_right_name(join);
  right.topic = right.repartition_topic = join.join->subscription_topic;
  right.source = join.join->right_topic;
  right.changelog_topic = join.join->subscription_changelog_topic;
  return right;
}

void write_fk_left_row(storage::write_batch& batch, const changelog_target& t, int32_t partition, std::string_view key,
                       std::string_view row, int64_t input_offset) {
  std::optional<fk_left_row> decoded;
  if (!row.empty()) decoded = decode_fk_left_row(row);
  if (!decoded) {
    // No row (a tombstone), or a changelog record that is not a row (written by
    // something else): the key has no row.
    if (!row.empty())
      log()->warn("store {}: changelog record of partition {} is not a foreign-key join row; key deleted", t.def->name,
                  partition);
    batch.del(*t.sides, partition, key);
    batch.del(t.id, partition, key);
    return;
  }
  batch.put(*t.sides, partition, key, row);
  if (auto joined = t.join->joined(fk_sides(*decoded)))
    batch.put(t.id, partition, key, frame_value(input_offset, *joined));
  else batch.del(t.id, partition, key);
}

int64_t apply_changelog_record(storage::write_batch& batch, const changelog_target& t, int32_t partition,
                               const rd_kafka_message_t* m, int64_t& stream_time) {
  const auto& def = *t.def;
  const int64_t framed_offset = changelog_record_offset(m, m->offset);
  // A session's last record time.
  const std::optional<int64_t> last = changelog_header_number(m, changelog_last_header);
  const bool session = def.windowed() && is_session(*def.window);
  std::string_view key(static_cast<const char*>(m->key), m->key ? m->key_len : 0);
  // A windowed changelog record carries the event time of its update; the largest
  // is the partition's stream time.
  if (def.windowed()) stream_time = std::max(stream_time, rd_kafka_message_timestamp(m, nullptr));
  const std::string_view payload =
      m->payload ? std::string_view(static_cast<const char*>(m->payload), m->len) : std::string_view();
  if (t.fk_right) {
    // A foreign-key join's right side: its entries as they are stored.
    if (m->payload) batch.put(t.id, partition, key, payload);
    else batch.del(t.id, partition, key);
  } else if (t.join && def.is_fk_join()) {
    // A foreign-key join's left rows; the joined value is made from them again.
    write_fk_left_row(batch, t, partition, key, payload, framed_offset);
  } else if (t.join) {
    // The sides are changelogged; the joined value is made from them again.
    write_join_sides(batch, t, partition, key, payload, framed_offset);
  } else if (m->payload && session && !last) {
    // Not written by kstate (a session's record always says where it ends): left
    // out rather than stored as a session of unknown length.
    log()->warn("changelog {}-{}@{}: a session without its {} header: skipped", def.changelog_topic, partition,
                m->offset, changelog_last_header);
  } else if (m->payload && session) {
    batch.put(t.id, partition, key, frame_value(framed_offset, *last, {static_cast<const char*>(m->payload), m->len}));
  } else if (m->payload) {
    batch.put(t.id, partition, key, frame_value(framed_offset, {static_cast<const char*>(m->payload), m->len}));
  } else {
    batch.del(t.id, partition, key);
  }
  return framed_offset;
}

}  // namespace kstate::ingest
