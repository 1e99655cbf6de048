#include "ingest/group_secret.h"

#include "kafka_common.h"

#include <openssl/rand.h>

#include <thread>

namespace kstate::ingest {
namespace {

constexpr std::size_t secret_bytes = 32;

status create_topic(rd_kafka_t* rk, const std::string& topic, std::chrono::milliseconds timeout) {
  char err[512];
  rd_kafka_NewTopic_t* nt = rd_kafka_NewTopic_new(topic.c_str(), 1, -1, err, sizeof err);
  if (!nt) return status::invalid_argument("topic '" + topic + "': " + err);
  // Kept forever: the first record is the secret for as long as the group exists.
  for (const auto& [k, v] : {std::pair<const char*, const char*>{"cleanup.policy", "delete"},
                             {"retention.ms", "-1"},
                             {"retention.bytes", "-1"}})
    rd_kafka_NewTopic_set_config(nt, k, v);
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
  rd_kafka_CreateTopics(rk, &nt, 1, nullptr, q);
  event_ptr ev(rd_kafka_queue_poll(q, static_cast<int>(timeout.count())));
  status result = status::ok_status();
  if (!ev) {
    result = status::unavailable("creating topic '" + topic + "' timed out");
  } else if (rd_kafka_event_error(ev.get())) {
    result = status::unavailable("creating topic '" + topic + "': " + rd_kafka_event_error_string(ev.get()));
  } else {
    size_t cnt = 0;
    const auto* res = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev.get()), &cnt);
    for (size_t i = 0; i < cnt; ++i) {
      auto e = rd_kafka_topic_result_error(res[i]);
      if (e == RD_KAFKA_RESP_ERR_NO_ERROR) log()->info("created topic {}", topic);
      else if (e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
        result = status::unavailable("creating topic '" + topic + "': " + rd_kafka_topic_result_error_string(res[i]));
    }
  }
  ev.reset();
  rd_kafka_queue_destroy(q);
  rd_kafka_NewTopic_destroy(nt);
  return result;
}

// The first record of the topic's only partition; nullopt when the partition is empty.
result<std::optional<std::string>> first_record(rd_kafka_t* consumer, const std::string& topic,
                                                std::chrono::steady_clock::time_point deadline) {
  tpl_ptr list(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
  if (auto e = rd_kafka_assign(consumer, list.get()))
    return status::unavailable(std::string("assign: ") + rd_kafka_err2str(e));
  std::optional<std::string> out;
  status failed = status::ok_status();
  while (std::chrono::steady_clock::now() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer, 200);
    if (!m) continue;
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      rd_kafka_message_destroy(m);
      break;
    }
    if (m->err) {
      std::string why = rd_kafka_message_errstr(m);
      bool retriable = m->err == RD_KAFKA_RESP_ERR__TRANSPORT || m->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
                       m->err == RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE;
      rd_kafka_message_destroy(m);
      if (retriable) continue;
      failed = status::unavailable("reading '" + topic + "': " + why);
      break;
    }
    if (m->payload && m->len >= 16) out = std::string(static_cast<const char*>(m->payload), m->len);
    rd_kafka_message_destroy(m);
    break;
  }
  (void)rd_kafka_assign(consumer, nullptr);  // a failed unassign leaves nothing to undo here
  if (!failed.ok()) return failed;
  if (!out && std::chrono::steady_clock::now() >= deadline)
    return status::unavailable("reading '" + topic + "' timed out");
  return out;
}

}  // namespace

std::string group_secret_topic(const std::string& application_id) { return application_id + "-peer-secret"; }

result<std::string> read_group_secret(const ingest_config& cfg, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto topic = group_secret_topic(cfg.application_id);
  auto producer = create_client(cfg, group_secret_spec(cfg, RD_KAFKA_PRODUCER));
  if (!producer.ok()) return producer.error();
  if (auto s = create_topic(producer->get(), topic, timeout); !s.ok()) return s;
  auto consumer = create_client(cfg, group_secret_spec(cfg, RD_KAFKA_CONSUMER));
  if (!consumer.ok()) return consumer.error();
  for (int attempt = 0;; ++attempt) {
    auto first = first_record(consumer->get(), topic, deadline);
    if (!first.ok()) return first.error();
    if (*first) return std::move(**first);
    if (attempt > 0 && std::chrono::steady_clock::now() >= deadline)
      return status::unavailable("no secret appeared in '" + topic + "'");
    // Empty: write one. Several instances may do so at once; the first record wins for
    // all of them, since everyone reads the first one.
    unsigned char raw[secret_bytes];
    if (RAND_bytes(raw, sizeof raw) != 1) return status::internal("no random bytes for the group secret");
    static constexpr char hex[] = "0123456789abcdef";
    std::string secret(2 * secret_bytes, '0');
    for (std::size_t i = 0; i < secret_bytes; ++i) {
      secret[2 * i] = hex[raw[i] >> 4];
      secret[2 * i + 1] = hex[raw[i] & 15];
    }
    auto err = rd_kafka_producev(producer->get(), RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(0),
                                 RD_KAFKA_V_VALUE(secret.data(), secret.size()),
                                 RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    if (err) return status::unavailable("writing the group secret to '" + topic + "': " + rd_kafka_err2str(err));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (auto f = rd_kafka_flush(producer->get(), static_cast<int>(std::max<int64_t>(left.count(), 1000))))
      return status::unavailable("writing the group secret to '" + topic + "': " + rd_kafka_err2str(f));
  }
}

}  // namespace kstate::ingest
