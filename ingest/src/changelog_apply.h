#pragma once
// Applying one changelog record of an aggregate view to a RocksDB batch (internal to
// ingest): what a changelog restore does with each record, and what a standby copy
// following the changelog does alike, so both store the same state as the owner.
//
// Threading: plain functions; the caller owns the batch.

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/view.h"
#include "ingest/join.h"
#include "storage/db.h"

namespace kstate::ingest {

// The column families one aggregate view's changelog record updates.
struct changelog_target {
  const view_def* def = nullptr;
  storage::view_id id = 0;
  // Join views: the column family of the sides (a foreign-key join's left rows), and the
  // joiner making the joined value.
  std::optional<storage::view_id> sides;
  const joiner* join = nullptr;
  // A foreign-key join's right side (`def` is fk_right_view() of the join, `id` the
  // column family `<view>#fk`): its entries are stored as the changelog holds them.
  bool fk_right = false;
};

// The view a foreign-key join's right side is kept as (stage 2 of the subscription
// topic): named fk_right_name(join), its store topic the subscription topic, its
// changelog the subscription changelog. Its positions are offsets of those two topics.
view_def fk_right_view(const view_def& join);

// Adds a join key's new sides to `batch`: the sides, and the joined value they make (or
// its deletion), framed with `input_offset`. Empty sides (a tombstone) delete both.
void write_join_sides(storage::write_batch& batch, const changelog_target& t, int32_t partition, std::string_view key,
                      std::string_view sides, int64_t input_offset);

// Adds a foreign-key join's left row to `batch`: the row in the sides column family and
// the joined value it makes (or their deletion), framed with `input_offset`. An empty
// row (a tombstone) deletes both.
void write_fk_left_row(storage::write_batch& batch, const changelog_target& t, int32_t partition, std::string_view key,
                       std::string_view row, int64_t input_offset);

// Adds changelog record `m` (of partition `partition` of t's changelog) to `batch` as a
// restore stores it: the aggregate framed with the store-topic offset of its
// kstate.offset header (else the changelog offset), a session with its kstate.last
// header's last record time (a session without one is logged and left out), a join's
// sides (a foreign-key join's left row) with the joined value made again, a foreign-key
// join's right entry as it is, a tombstone as a delete. A windowed view's
// `stream_time` becomes at least the record's timestamp. Returns the store-topic offset
// the record reports (kstate.offset, else its changelog offset).
int64_t apply_changelog_record(storage::write_batch& batch, const changelog_target& t, int32_t partition,
                               const rd_kafka_message_t* m, int64_t& stream_time);

}  // namespace kstate::ingest
