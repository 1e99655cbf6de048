#pragma once
// session_fold: what one record does to the sessions of its key (session windows,
// core/window.h), without Kafka or RocksDB: which sessions it merges, the merged
// session's bounds and aggregate, or that it is late. agg_pipeline finds the sessions
// and writes the outcome; tests check it against a recomputation.
//
// Thread safety: a pure function.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/window.h"
#include "ingest/aggregation.h"

namespace kstate::ingest {

// One session of a key: the times of its first and last records, and its aggregate.
struct stored_session {
  int64_t start = 0;
  int64_t last = 0;
  std::string state;  // aggregate JSON
};

struct session_change {
  bool late = false;             // the merged session had closed: nothing changes
  std::string error;             // the view refused the record (or a stored aggregate): nothing changes
  std::vector<int64_t> removed;  // starts of the sessions merged away (their keys are deleted)
  stored_session merged;         // the session the record is now part of
};

// Folds the record at event time `t` with `value` into its key's sessions. `joined` are
// the live sessions it reaches (session_reaches), ascending by start; `stream_time`
// already counts `t`. The merged session spans them all and `t`; it is late when it is
// closed at `stream_time` (session_closed: last + gap + grace < stream time). Its
// aggregate merges those of `joined` in order, then folds the record, so reduce latest
// ends with the record's value.
session_change fold_session(const aggregator& agg, const window_spec& spec, const std::vector<stored_session>& joined,
                            int64_t t, int64_t stream_time, std::optional<std::string_view> value);

}  // namespace kstate::ingest
