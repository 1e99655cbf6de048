#include "ingest/change_feed.h"

#include "agg_pipeline.h"
#include "core/window.h"
#include "ingest/batch_builder.h"
#include "ingest/fk_join.h"
#include "ingest/join.h"
#include "kafka_common.h"

namespace kstate::ingest {

bool feed_selection::matches(std::string_view key) const {
  if (!keys.empty()) {
    for (const auto& k : keys)
      if (k == key) return true;
    return false;
  }
  if (prefix && key.substr(0, prefix->size()) != *prefix) return false;
  if (from && key < *from) return false;
  if (to && !(key < *to)) return false;
  return true;
}

const std::string& feed_topic(const view_def& view) { return view.is_aggregate() ? view.changelog_topic : view.topic; }

namespace {

// An assign-only reader of committed records: no group is joined and nothing is
// committed. A position outside what the topic holds is an error, never a jump to one
// of its ends (auto.offset.reset=error).
client_spec feed_consumer_spec(const ingest_config& cfg, bool report_end) {
  return {RD_KAFKA_CONSUMER,
          "change feed consumer",
          "-feed",
          {{"fetch.wait.max.ms", "100"}},
          {{"group.id", cfg.application_id + ".feed"},
           {"isolation.level", "read_committed"},
           {"enable.auto.commit", "false"},
           {"enable.auto.offset.store", "false"},
           {"enable.partition.eof", report_end ? "true" : "false"},
           {"auto.offset.reset", "error"}}};
}

struct message_deleter {
  void operator()(rd_kafka_message_t* m) const { rd_kafka_message_destroy(m); }
};
using message_ptr = std::unique_ptr<rd_kafka_message_t, message_deleter>;

}  // namespace

struct change_feed::impl {
  view_def view;
  int max_json_depth = 0;
  // Join views: their changelog holds each key's two sides; a change is the joined
  // value they make.
  std::optional<joiner> join;
  client_ptr consumer;
  std::map<int32_t, int64_t> pos;
  std::set<int32_t> caught_up;
  std::map<int32_t, int64_t> max_ts;
};

change_feed::change_feed(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

change_feed::~change_feed() {
  // Never joined a group: nothing to leave or commit.
  if (impl_ && impl_->consumer) rd_kafka_destroy_flags(impl_->consumer.release(), RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
}

result<std::unique_ptr<change_feed>> change_feed::open(const ingest_config& cfg, const view_def& view,
                                                       const std::map<int32_t, std::optional<int64_t>>& start,
                                                       int max_json_depth, const feed_options& options) {
  const std::string& topic = feed_topic(view);
  if (topic.empty()) return status::invalid_argument("view '" + view.name + "' has no topic recording its changes");
  auto rk = create_client(cfg, feed_consumer_spec(cfg, options.report_end));
  if (!rk.ok()) return rk.error();
  auto i = std::make_unique<impl>();
  i->view = view;
  i->max_json_depth = max_json_depth;
  if (view.join) i->join.emplace(view, max_json_depth);
  i->consumer = std::move(rk.value());
  tpl_ptr parts(rd_kafka_topic_partition_list_new(static_cast<int>(start.size())));
  for (const auto& [p, offset] : start) {
    int64_t low = 0, high = 0;
    auto err = rd_kafka_query_watermark_offsets(i->consumer.get(), topic.c_str(), p, &low, &high, 5000);
    if (err)
      return status::unavailable("reading the offsets of " + topic + "/" + std::to_string(p) + ": " +
                                 rd_kafka_err2str(err));
    const int64_t at = options.from_beginning ? low : offset.value_or(high);
    if (at < low)
      return status::not_found("partition " + std::to_string(p) + " of '" + topic + "' no longer holds offset " +
                               std::to_string(at) + " (it begins at " + std::to_string(low) +
                               "): the changes before that are gone");
    if (at > high)
      return status::invalid_argument("partition " + std::to_string(p) + " of '" + topic + "' ends at offset " +
                                      std::to_string(high) + "; a position of " + std::to_string(at) + " is beyond it");
    rd_kafka_topic_partition_list_add(parts.get(), topic.c_str(), p)->offset = at;
    i->pos[p] = at;
  }
  if (auto err = rd_kafka_assign(i->consumer.get(), parts.get()))
    return status::internal(std::string("assigning the change feed's partitions: ") + rd_kafka_err2str(err));
  return std::unique_ptr<change_feed>(new change_feed(std::move(i)));
}

result<std::vector<feed_change>> change_feed::poll(const feed_selection& sel, std::chrono::milliseconds wait,
                                                   size_t max, size_t max_bytes) {
  std::vector<feed_change> out;
  size_t bytes = 0;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (out.size() < max && bytes < max_bytes) {
    // Waits for the first change; after it, takes only what is already fetched.
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int timeout = out.empty() ? static_cast<int>(std::max<int64_t>(0, left.count())) : 0;
    message_ptr m(rd_kafka_consumer_poll(impl_->consumer.get(), timeout));
    if (!m) {
      if (!out.empty() || left.count() <= 0) break;
      continue;
    }
    if (m->err) {
      if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET || m->err == RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE)
        return status::not_found(
            "partition " + std::to_string(m->partition) + " of '" + feed_topic(impl_->view) +
            "' no longer holds the changes after this position: " + rd_kafka_message_errstr(m.get()));
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        // The end of what the partition holds: the records before it were all returned,
        // so the position may move over the transaction markers that end it.
        auto it = impl_->pos.find(m->partition);
        if (it == impl_->pos.end()) continue;
        it->second = std::max(it->second, m->offset);
        if (impl_->caught_up.insert(m->partition).second) break;  // a caller waits for it
        continue;
      }
      // Transient (a broker restarting, a leader moving): librdkafka retries by itself.
      log()->debug("change feed of '{}': {}", impl_->view.name, rd_kafka_message_errstr(m.get()));
      continue;
    }
    auto it = impl_->pos.find(m->partition);
    if (it == impl_->pos.end() || m->offset < it->second) continue;  // not asked for, or already read
    it->second = m->offset + 1;
    const int64_t ts = rd_kafka_message_timestamp(m.get(), nullptr);
    if (auto [t, added] = impl_->max_ts.emplace(m->partition, ts); !added) t->second = std::max(t->second, ts);
    const view_def& v = impl_->view;
    std::optional<std::string_view> key, value;
    if (m->key) key = std::string_view(static_cast<const char*>(m->key), m->key_len);
    if (m->payload) value = std::string_view(static_cast<const char*>(m->payload), m->len);
    feed_change c;
    c.partition = m->partition;
    c.offset = m->offset;
    c.timestamp = ts;
    if (v.is_aggregate()) {
      // kstate wrote this changelog record; one it cannot read (no key, a windowed key
      // that does not decode) was not written by this view and is no change of it.
      if (!key) continue;
      if (v.windowed()) {
        auto wk = decode_windowed_key(*key);
        if (!wk) {
          log()->debug("change feed of '{}': {}-{}@{} is not a windowed key", v.name, feed_topic(v), m->partition,
                       m->offset);
          continue;
        }
        if (!sel.matches(wk->key)) continue;
        c.key = std::move(wk->key);
        c.window_start = wk->start;
      } else {
        if (!sel.matches(*key)) continue;
        c.key = std::string(*key);
      }
      c.source_offset = changelog_record_offset(m.get(), -1);
      if (v.windowed() && is_session(*v.window))
        c.session_last = changelog_header_number(m.get(), changelog_last_header);
    } else {
      record r;
      r.topic = v.topic;
      r.partition = m->partition;
      r.offset = m->offset;
      r.key = key;
      r.value = value;
      if (!validate(v, r, impl_->max_json_depth).empty() || !sel.matches(*r.key)) continue;
      c.key = std::string(*r.key);
      c.source_offset = m->offset;
    }
    if (impl_->join && value) {
      // A foreign-key join's changelog holds each left key's row; its joined value is
      // what the row's left value and answered right value make.
      std::optional<join_sides> sides;
      if (v.is_fk_join()) {
        if (auto row = decode_fk_left_row(*value)) sides = fk_sides(*row);
      } else {
        sides = decode_sides(*value);
      }
      if (!sides) {
        log()->debug("change feed of '{}': {}-{}@{} is not a join's sides", v.name, feed_topic(v), m->partition,
                     m->offset);
        continue;
      }
      c.value = impl_->join->joined(*sides);  // none: the join holds no row for the key
    } else if (value) {
      c.value = std::string(*value);
    }
    bytes += c.key.size() + (c.value ? c.value->size() : 0);
    out.push_back(std::move(c));
  }
  return out;
}

const std::map<int32_t, int64_t>& change_feed::position() const { return impl_->pos; }
const std::set<int32_t>& change_feed::caught_up() const { return impl_->caught_up; }
const std::map<int32_t, int64_t>& change_feed::max_timestamps() const { return impl_->max_ts; }

}  // namespace kstate::ingest
