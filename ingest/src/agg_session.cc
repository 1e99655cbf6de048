// Session windows in the aggregate pipeline: finding the sessions a record reaches and
// writing what session_fold makes of them. A session is stored under
// encode_windowed_key(key, start) in a timed frame whose time is its last record time
// (core/value_codec.h); a merged-away session is deleted, and its changelog record is a
// tombstone, so the changelog restores exactly the live sessions.
#include "agg_pipeline.h"

#include "kafka_common.h"

#include <spdlog/spdlog.h>

#include <limits>
#include <map>
#include <optional>

#include "core/value_codec.h"

namespace kstate::ingest {

namespace {

int64_t saturating_add(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

// Sessions by start, as the layers read so far leave them (RocksDB, then the newer
// overlays): nullopt for one an overlay deleted.
using session_layers = std::map<int64_t, std::optional<stored_session>>;

}  // namespace

result<std::vector<stored_session>> agg_pipeline::sessions_near(view_state& v, int32_t partition,
                                                                const std::string& key, int64_t t,
                                                                int64_t stream_time) {
  const window_spec& spec = *v.def->window;
  const size_t idx = static_cast<size_t>(&v - views_.data());
  // A session reaching t starts at or before t + gap and ends at or after t - gap.
  const int64_t hi = saturating_add(t, spec.gap_ms);
  const int64_t lo =
      t < std::numeric_limits<int64_t>::min() + spec.gap_ms ? std::numeric_limits<int64_t>::min() : t - spec.gap_ms;
  const std::string prefix = windowed_key_prefix(key);
  // The first stored key after every session starting at or before hi.
  const std::string upper = encode_windowed_key(key, hi) + '\0';
  // An expired session is treated as gone whether compaction removed it yet or not, so
  // which sessions a record joins never depends on when compaction ran.
  auto expired = [&](int64_t last) { return session_expired(spec, last, stream_time); };

  // Each layer is walked from the latest start <= hi downwards. Sessions only grow, and
  // the live sessions of each layer are those of one state of the key (they never
  // overlap), so their ends descend with their starts: a layer's walk stops at its
  // first live session ending before lo.
  session_layers found;
  {
    auto snap = db_.read_snapshot();
    auto it = snap->scan(v.id, partition, prefix, upper, true, storage::scan_use::page);
    for (; it->valid(); it->next()) {
      auto wk = decode_windowed_key(it->key());
      auto f = unframe_value(it->value());
      if (!wk || !f || !f->time)
        return status::corruption("store " + v.def->name + ": a stored session of partition " +
                                  std::to_string(partition) + " is malformed");
      if (expired(*f->time)) continue;
      if (*f->time < lo) break;
      found[wk->start] = stored_session{wk->start, *f->time, std::string(f->value)};
    }
    if (auto e = it->error(); !e.ok()) return e.prefixed("reading the sessions of store " + v.def->name);
  }
  // The overlays: committed batches not yet written, then this batch (newest last).
  auto overlay = [&](auto& layer) {
    auto it = layer.upper_bound(std::make_tuple(idx, partition, upper));
    while (it != layer.begin()) {
      --it;
      const auto& [vi, p, stored] = it->first;
      if (vi != idx || p != partition || stored.compare(0, prefix.size(), prefix) != 0) break;
      auto wk = decode_windowed_key(stored);
      if (!wk) continue;
      const auto& e = it->second;
      if (e.deleted) {
        found[wk->start] = std::nullopt;
        continue;
      }
      if (!e.last || expired(*e.last)) continue;
      if (*e.last < lo) break;
      found[wk->start] = stored_session{wk->start, *e.last, e.state};
    }
  };
  overlay(unwritten_);
  overlay(cache_);
  std::vector<stored_session> out;
  for (auto& [start, s] : found)
    if (s && session_reaches(spec, s->start, s->last, t)) out.push_back(std::move(*s));
  return out;
}

result<bool> agg_pipeline::fold_session(view_state& v, const record& r, const std::string& key, int64_t ts,
                                        int64_t stream_time, bool& late) {
  const size_t idx = static_cast<size_t>(&v - views_.data());
  auto joined = sessions_near(v, r.partition, key, ts, stream_time);
  if (!joined.ok()) return joined.error();
  auto change = ingest::fold_session(v.agg, *v.def->window, joined.value(), ts, stream_time, r.value);
  if (change.late) {
    late = true;
    return false;
  }
  if (!change.error.empty()) {
    builder_.reject(*v.def, r, std::move(change.error));
    return false;
  }
  auto write = [&](int64_t start, cached c) {
    auto k = std::make_tuple(idx, r.partition, encode_windowed_key(key, start));
    auto& slot = cache_[k];
    slot = std::move(c);
    if (!v.def->cache) {
      auto s = produce_changelog(v, r.partition, std::get<2>(k), slot);
      if (!s.ok()) log()->error("{}", s.message());
    }
  };
  for (int64_t start : change.removed) {
    cached gone{};
    gone.input_offset = r.offset;
    gone.timestamp = ts;
    gone.dirty = true;
    gone.deleted = true;
    write(start, std::move(gone));
  }
  cached merged{};
  merged.state = std::move(change.merged.state);
  merged.input_offset = r.offset;
  // The changelog record is stamped with the session's last record time, not the
  // record's: the largest timestamp in the changelog is then exactly the partition's
  // stream time (the record that set it is in some session, whose last is at least its
  // time), which a restore recovers, and Kafka's time retention deletes sessions by end.
  merged.timestamp = change.merged.last;
  merged.dirty = true;
  merged.last = change.merged.last;
  write(change.merged.start, std::move(merged));
  return true;
}

}  // namespace kstate::ingest
