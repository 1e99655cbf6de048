#include "batch_loop.h"

#include "kafka_common.h"

namespace kstate::ingest {
namespace {

struct message_deleter {
  void operator()(rd_kafka_message_t* m) const { rd_kafka_message_destroy(m); }
};
using message_ptr = std::unique_ptr<rd_kafka_message_t, message_deleter>;

// The record a message holds; borrows the message's bytes.
record to_record(const rd_kafka_message_t* m) {
  record r;
  r.topic = rd_kafka_topic_name(m->rkt);
  r.partition = m->partition;
  r.offset = m->offset;
  r.timestamp = rd_kafka_message_timestamp(m, nullptr);
  if (m->key) r.key = std::string_view(static_cast<const char*>(m->key), m->key_len);
  if (m->payload) r.value = std::string_view(static_cast<const char*>(m->payload), m->len);
  return r;
}

}  // namespace

status run_batch_loop(rd_kafka_t* consumer, batch_builder& builder, const std::atomic<bool>& running,
                      const batch_loop_options& options, const batch_loop_hooks& hooks) {
  using clock = std::chrono::steady_clock;
  clock::time_point first_pending{};
  auto pending_now = [&] { return builder.pending_records() + (hooks.held ? hooks.held() : 0); };
  while (running) {
    if (hooks.each_turn)
      if (auto s = hooks.each_turn(); !s.ok()) return s;
    const bool wait = pending_now() == 0 && !(hooks.busy && hooks.busy());
    message_ptr m(rd_kafka_consumer_poll(consumer, wait ? options.idle_poll_ms : 0));
    const bool idle = !m;
    if (m) {
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        std::string topic = rd_kafka_topic_name(m->rkt);
        const int32_t partition = m->partition;
        const int64_t end = m->offset;
        m.reset();
        if (hooks.at_end)
          if (auto s = hooks.at_end(topic, partition, end); !s.ok()) return s;
        continue;
      }
      if (m->err) {
        std::string why = rd_kafka_message_errstr(m.get());
        log()->warn("{}: {}", options.name, why);
        if (m->err == RD_KAFKA_RESP_ERR__FATAL) return status::unavailable("fatal " + options.name + " error: " + why);
        continue;
      }
      bool taken = false;
      if (hooks.take) {
        const size_t before = pending_now();
        taken = hooks.take(m.get());
        if (taken && before == 0 && pending_now() > 0) first_pending = clock::now();
      }
      const record r = taken ? record{} : to_record(m.get());
      if (!taken && (!hooks.accept || hooks.accept(r))) {
        if (pending_now() == 0) first_pending = clock::now();
        builder.add(r);
        if (hooks.after_add)
          if (auto s = hooks.after_add(r); !s.ok()) return s;
      }
      m.reset();
    }
    if (idle && hooks.idle) hooks.idle();
    // The clock is read every 64 records: a batch may run up to 63 records past
    // max_batch_delay, a few microseconds. A delay of 0 writes every record at once.
    const size_t pending = pending_now();
    const bool delay_over = options.max_batch_delay.count() == 0 ||
                            ((pending & 63) == 0 && clock::now() - first_pending >= options.max_batch_delay);
    if (pending > 0 && (idle || pending >= options.max_batch_records || delay_over))
      if (auto s = hooks.write(); !s.ok()) return s;
  }
  return status::ok_status();
}

}  // namespace kstate::ingest
