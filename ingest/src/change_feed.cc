#include "ingest/change_feed.h"

#include "ingest/batch_builder.h"
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

namespace {

// An assign-only reader of committed records: no group is joined and nothing is
// committed. A position outside what the topic holds is an error, never a jump to one
// of its ends (auto.offset.reset=error).
client_spec feed_consumer_spec(const ingest_config& cfg) {
  return {RD_KAFKA_CONSUMER,
          "change feed consumer",
          "-feed",
          {{"fetch.wait.max.ms", "100"}},
          {{"group.id", cfg.application_id + ".feed"},
           {"isolation.level", "read_committed"},
           {"enable.auto.commit", "false"},
           {"enable.auto.offset.store", "false"},
           {"enable.partition.eof", "false"},
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
  client_ptr consumer;
  std::map<int32_t, int64_t> pos;
};

change_feed::change_feed(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

change_feed::~change_feed() {
  // Never joined a group: nothing to leave or commit.
  if (impl_ && impl_->consumer) rd_kafka_destroy_flags(impl_->consumer.release(), RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
}

result<std::unique_ptr<change_feed>> change_feed::open(const ingest_config& cfg, const view_def& view,
                                                       const std::map<int32_t, std::optional<int64_t>>& start,
                                                       int max_json_depth) {
  if (view.kind != view_kind::table) return status::invalid_argument("changes are read of table views only");
  auto rk = create_client(cfg, feed_consumer_spec(cfg));
  if (!rk.ok()) return rk.error();
  auto i = std::make_unique<impl>();
  i->view = view;
  i->max_json_depth = max_json_depth;
  i->consumer = std::move(rk.value());
  tpl_ptr parts(rd_kafka_topic_partition_list_new(static_cast<int>(start.size())));
  for (const auto& [p, offset] : start) {
    int64_t low = 0, high = 0;
    auto err = rd_kafka_query_watermark_offsets(i->consumer.get(), view.topic.c_str(), p, &low, &high, 5000);
    if (err)
      return status::unavailable("reading the offsets of " + view.topic + "/" + std::to_string(p) + ": " +
                                 rd_kafka_err2str(err));
    const int64_t at = offset.value_or(high);
    if (at < low)
      return status::not_found("partition " + std::to_string(p) + " of '" + view.topic + "' no longer holds offset " +
                               std::to_string(at) + " (it begins at " + std::to_string(low) +
                               "): the changes before that are gone");
    if (at > high)
      return status::invalid_argument("partition " + std::to_string(p) + " of '" + view.topic + "' ends at offset " +
                                      std::to_string(high) + "; a position of " + std::to_string(at) + " is beyond it");
    rd_kafka_topic_partition_list_add(parts.get(), view.topic.c_str(), p)->offset = at;
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
            "partition " + std::to_string(m->partition) + " of '" + impl_->view.topic +
            "' no longer holds the changes after this position: " + rd_kafka_message_errstr(m.get()));
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) continue;
      // Transient (a broker restarting, a leader moving): librdkafka retries by itself.
      log()->debug("change feed of '{}': {}", impl_->view.name, rd_kafka_message_errstr(m.get()));
      continue;
    }
    auto it = impl_->pos.find(m->partition);
    if (it == impl_->pos.end() || m->offset < it->second) continue;  // not asked for, or already read
    it->second = m->offset + 1;
    record r;
    r.topic = impl_->view.topic;
    r.partition = m->partition;
    r.offset = m->offset;
    if (m->key) r.key = std::string_view(static_cast<const char*>(m->key), m->key_len);
    if (m->payload) r.value = std::string_view(static_cast<const char*>(m->payload), m->len);
    if (!validate(impl_->view, r, impl_->max_json_depth).empty() || !sel.matches(*r.key)) continue;
    feed_change c{m->partition, m->offset, std::string(*r.key), std::nullopt,
                  rd_kafka_message_timestamp(m.get(), nullptr)};
    if (r.value) c.value = std::string(*r.value);
    bytes += c.key.size() + (c.value ? c.value->size() : 0);
    out.push_back(std::move(c));
  }
  return out;
}

const std::map<int32_t, int64_t>& change_feed::position() const { return impl_->pos; }

}  // namespace kstate::ingest
