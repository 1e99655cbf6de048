#include "dead_letters.h"

#include "kafka_common.h"
#include "metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace kstate::ingest {
namespace {

static_assert(sizeof(uintptr_t) >= 8, "a delivery tag holds a 32-bit round and a 32-bit index");

// A stop waits this long for dead letters already sent before it gives the batch up.
constexpr std::chrono::seconds stop_wait{10};
// Pause between rounds that retry transient failures.
constexpr std::chrono::seconds retry_backoff{1};
// How often a long wait for delivery reports is logged.
constexpr std::chrono::seconds wait_log_interval{10};

struct headers_deleter {
  void operator()(rd_kafka_headers_t* h) const { rd_kafka_headers_destroy(h); }
};
using headers_ptr = std::unique_ptr<rd_kafka_headers_t, headers_deleter>;

void add_header(rd_kafka_headers_t* h, const char* name, std::string_view value) {
  // Fails only on read-only headers, which new ones are not.
  (void)rd_kafka_header_add(h, name, -1, value.data(), static_cast<ssize_t>(value.size()));
}

}  // namespace

struct dead_letter_sender::letter {
  enum class form {
    whole,        // the record as consumed, sent with the batch's other dead letters
    whole_alone,  // the same, alone: a batch of several may be too large where one is not
    envelope,     // a bounded summary of the record
  };
  const rejection* r;
  form shape = form::whole;
  bool settled = false;
  // The outcome of the latest attempt, and whether producev() refused it itself (it
  // never reached a broker, so sending it alone would change nothing).
  rd_kafka_resp_err_t last = RD_KAFKA_RESP_ERR_NO_ERROR;
  bool refused_locally = false;
  // Why the whole record could not be produced (the envelope's kstate.dead_letter_error).
  rd_kafka_resp_err_t whole_error = RD_KAFKA_RESP_ERR_NO_ERROR;
};

void dead_letter_report(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  auto* self = static_cast<dead_letter_sender*>(opaque);
  auto tag = reinterpret_cast<uintptr_t>(m->_private);
  if ((tag >> 32) != self->round_) return;  // a round given up at a stop
  size_t i = tag & 0xffffffffu;
  if (i >= self->reports_.size() || self->reported_[i]) return;
  self->reports_[i] = m->err;
  self->reported_[i] = true;
  --self->outstanding_;
}

// The rule, from librdkafka's documentation (INTRODUCTION.md, "Producer message delivery
// failure"; rdkafka.h, rd_kafka_produce()): librdkafka retries temporary errors itself
// and reports a delivery error only once its retries or message.timeout.ms ran out, or
// for a permanent error. So:
// - transient: the cluster or the connection is at fault, not the record; producing the
//   same record again later can succeed. Timeouts and transport failures, a leader or
//   enough replicas missing, a full local queue, our own purge at a stop, and failures
//   of the idempotent producer's state (a fatal producer error, sequence or epoch
//   errors that follow another batch's failure): the producer is replaced first.
// - too_large: the broker (MSG_SIZE_TOO_LARGE: the topic's max.message.bytes or the
//   broker's message.max.bytes) or the producer (producev(): larger than its
//   message.max.bytes) refuses the size. A batch of several dead letters can be too
//   large where each alone is not, so a record refused in a batch is sent alone once.
// - permanent: anything else, as librdkafka counts it: the record (INVALID_RECORD,
//   CORRUPT_MESSAGE, INVALID_TIMESTAMP, POLICY_VIOLATION, ...) or its topic
//   (TOPIC_AUTHORIZATION_FAILED; UNKNOWN_TOPIC_OR_PART, which librdkafka reports only
//   after its metadata says the topic or partition is gone) cannot be produced, and
//   retrying cannot change that. (INVALID_MSG is the broker's CORRUPT_MESSAGE.)
dead_letter_sender::failure dead_letter_sender::classify(rd_kafka_resp_err_t err) {
  switch (err) {
    case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
    case RD_KAFKA_RESP_ERR__QUEUE_FULL:
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
    case RD_KAFKA_RESP_ERR__FATAL:
    case RD_KAFKA_RESP_ERR__GAPLESS_GUARANTEE:
    case RD_KAFKA_RESP_ERR__INCONSISTENT:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
    case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
    case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
    case RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR:
    case RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED:
    case RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER:
    case RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH:
    case RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID: return failure::transient;
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE: return failure::too_large;
    default: return failure::permanent;
  }
}

// The `reason` label of the truncated and failed counters: a fixed set.
const char* dead_letter_sender::reason_label(rd_kafka_resp_err_t err) {
  switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE: return "too_large";
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED: return "not_authorized";
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION: return "unknown_topic";
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT: return "invalid_record";
    default: return "other";
  }
}

dead_letter_sender::dead_letter_sender(const ingest_config& cfg, error_fn on_error, keep_trying_fn keep_trying,
                                       ingest_stats& stats, prometheus::Registry* metrics)
    : cfg_(cfg), on_error_(std::move(on_error)), keep_trying_(std::move(keep_trying)), stats_(stats) {
  if (metrics) {
    m_dead_lettered_ = &counter_family(*metrics, "kstate_ingest_records_dead_lettered_total",
                                       "Rejected records delivered to a dead-letter topic (whole or as an envelope)");
    m_truncated_ = &counter_family(*metrics, "kstate_ingest_dead_letters_truncated_total",
                                   "Dead letters delivered as a bounded envelope because the whole record could not be "
                                   "produced, by why");
    m_failed_ = &counter_family(*metrics, "kstate_ingest_dead_letters_failed_total",
                                "Dead letters that could not be delivered, not even as an envelope, by why");
    m_waiting_ = &unlabelled_gauge(*metrics, "kstate_ingest_dead_letters_waiting",
                                   "Dead letters of the batch being written that Kafka has not accepted yet; above 0 "
                                   "for long, ingest waits on the dead-letter topic");
  }
}

dead_letter_sender::~dead_letter_sender() {
  if (producer_) rd_kafka_destroy(producer_);
}

status dead_letter_sender::start() { return create_producer(); }

status dead_letter_sender::create_producer() {
  auto rk = create_client(cfg_, dead_letter_producer_spec(), [this](rd_kafka_conf_t* conf) {
    rd_kafka_conf_set_opaque(conf, this);
    rd_kafka_conf_set_dr_msg_cb(conf, dead_letter_report);
    rd_kafka_conf_set_error_cb(conf, [](rd_kafka_t*, int err, const char* reason, void* opaque) {
      static_cast<dead_letter_sender*>(opaque)->on_error_(static_cast<rd_kafka_resp_err_t>(err), reason);
    });
  });
  if (!rk.ok()) return rk.error();
  producer_ = rk.value().release();
  return status::ok_status();
}

void dead_letter_sender::replace_producer_if_fatal() {
  char why[512] = "";
  auto err = producer_ ? rd_kafka_fatal_error(producer_, why, sizeof why) : RD_KAFKA_RESP_ERR__FATAL;
  if (err == RD_KAFKA_RESP_ERR_NO_ERROR) return;
  if (producer_) {
    log()->error("dead-letter producer failed ({}: {}); replacing it", rd_kafka_err2name(err), why);
    // Its messages are reported (and ignored: their round is over) or dropped with it.
    (void)rd_kafka_purge(producer_, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_destroy(producer_);
    producer_ = nullptr;
  }
  if (auto s = create_producer(); !s.ok()) log()->error("{}; retrying", s.message());
}

rd_kafka_resp_err_t dead_letter_sender::produce(const letter& l, uintptr_t tag) {
  if (!producer_) return RD_KAFKA_RESP_ERR__FATAL;
  const rejection& r = *l.r;
  const bool envelope = l.shape == letter::form::envelope;
  headers_ptr h(rd_kafka_headers_new(envelope ? 9 : 5));
  auto part = std::to_string(r.partition), off = std::to_string(r.offset);
  std::string_view reason = r.reason;
  if (envelope && reason.size() > envelope_bytes) reason = reason.substr(0, envelope_bytes);
  add_header(h.get(), "kstate.reason", reason);
  add_header(h.get(), "kstate.view", r.view);
  add_header(h.get(), "kstate.topic", r.topic);
  add_header(h.get(), "kstate.partition", part);
  add_header(h.get(), "kstate.offset", off);
  // Null pointers for a null key or a tombstone.
  const char* key_ptr = r.key ? r.key->data() : nullptr;
  size_t key_len = r.key ? r.key->size() : 0;
  const char* value_ptr = r.value ? r.value->data() : nullptr;
  size_t value_len = r.value ? r.value->size() : 0;
  if (envelope) {
    add_header(h.get(), "kstate.truncated", "true");
    if (r.key) add_header(h.get(), "kstate.original_key_size", std::to_string(key_len));
    if (r.value) add_header(h.get(), "kstate.original_size", std::to_string(value_len));
    add_header(h.get(), "kstate.dead_letter_error", rd_kafka_err2name(l.whole_error));
    if (key_len > envelope_bytes) {
      key_ptr = nullptr;
      key_len = 0;
    }
    // A byte prefix: for text it may end inside a multi-byte character.
    value_len = std::min(value_len, envelope_bytes);
  }
  auto err =
      rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC(r.dead_letter_topic.c_str()), RD_KAFKA_V_KEY(key_ptr, key_len),
                        RD_KAFKA_V_VALUE(const_cast<char*>(value_ptr), value_len),  // copied: MSG_F_COPY
                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h.get()),
                        RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(tag)), RD_KAFKA_V_END);
  if (!err) (void)h.release();  // the message owns its headers once produced
  return err;
}

bool dead_letter_sender::send(const std::vector<letter*>& group) {
  if (group.empty()) return true;
  using clock = std::chrono::steady_clock;
  replace_producer_if_fatal();
  ++round_;
  reports_.assign(group.size(), RD_KAFKA_RESP_ERR_NO_ERROR);
  reported_.assign(group.size(), false);
  outstanding_ = 0;
  auto started = clock::now();
  auto stopping_too_long = [&] { return !keep_trying_() && clock::now() - started >= stop_wait; };
  for (size_t i = 0; i < group.size(); ++i) {
    auto tag = (static_cast<uintptr_t>(round_) << 32) | i;
    rd_kafka_resp_err_t err;
    // A full queue empties as earlier messages are reported (each within
    // message.timeout.ms).
    while ((err = produce(*group[i], tag)) == RD_KAFKA_RESP_ERR__QUEUE_FULL && !stopping_too_long())
      rd_kafka_poll(producer_, 100);
    group[i]->refused_locally = err != RD_KAFKA_RESP_ERR_NO_ERROR;
    group[i]->last = err;
    if (!err) ++outstanding_;
  }
  auto last_log = started;
  bool complete = true;
  while (outstanding_ > 0) {
    // Each message is reported within message.timeout.ms: the wait is bounded while
    // running; a stop gives it up after stop_wait.
    rd_kafka_flush(producer_, 1000);
    if (outstanding_ == 0) break;
    if (stopping_too_long()) {
      (void)rd_kafka_purge(producer_, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
      rd_kafka_poll(producer_, 0);
      complete = false;
      break;
    }
    if (clock::now() - last_log >= wait_log_interval) {
      log()->warn("waiting for {} dead-letter deliveries", outstanding_);
      last_log = clock::now();
    }
  }
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i]->refused_locally) continue;
    // Not reported when given up at a stop: unknown, so transient.
    group[i]->last = reported_[i] ? reports_[i] : RD_KAFKA_RESP_ERR__PURGE_INFLIGHT;
  }
  return complete;
}

void dead_letter_sender::settle(letter& l) {
  const rejection& r = *l.r;
  if (l.last == RD_KAFKA_RESP_ERR_NO_ERROR) {
    l.settled = true;
    ++stats_.dead_lettered;
    if (m_dead_lettered_)
      m_dead_lettered_->Add({{"store", r.view}, {"topic", r.topic}, {"partition", std::to_string(r.partition)}})
          .Increment();
    if (l.shape == letter::form::envelope) {
      ++stats_.dead_letters_truncated;
      if (m_truncated_)
        m_truncated_->Add({{"store", r.view}, {"topic", r.topic}, {"reason", reason_label(l.whole_error)}}).Increment();
      log()->warn(
          "dead letter of {}-{}@{} (store {}) could not be produced whole to {} ({}); delivered an envelope "
          "with its first {} bytes instead",
          r.topic, r.partition, r.offset, r.view, r.dead_letter_topic, rd_kafka_err2str(l.whole_error),
          std::min(envelope_bytes, r.value ? r.value->size() : size_t{0}));
    }
    return;
  }
  auto kind = classify(l.last);
  if (kind == failure::transient) {
    // The same again, next round; said once per wait_log_interval.
    if (auto now = std::chrono::steady_clock::now(); now - last_transient_log_ >= wait_log_interval) {
      last_transient_log_ = now;
      log()->warn(
          "dead letter of {}-{}@{} (store {}) not accepted by {} yet ({}); retrying, ingest waits until it is "
          "(kstate_ingest_dead_letters_waiting)",
          r.topic, r.partition, r.offset, r.view, r.dead_letter_topic, rd_kafka_err2str(l.last));
    }
    return;
  }
  if (l.shape == letter::form::whole && kind == failure::too_large && !l.refused_locally) {
    l.shape = letter::form::whole_alone;
    return;
  }
  if (l.shape != letter::form::envelope) {
    l.whole_error = l.last;
    l.shape = letter::form::envelope;
    return;
  }
  l.settled = true;
  ++stats_.dead_letters_failed;
  if (m_failed_) m_failed_->Add({{"store", r.view}, {"topic", r.topic}, {"reason", reason_label(l.last)}}).Increment();
  log()->error(
      "dead letter of {}-{}@{} (store {}) could not be delivered to {}, not even as an envelope ({}; the "
      "whole record: {}); skipped, counted in kstate_ingest_dead_letters_failed_total",
      r.topic, r.partition, r.offset, r.view, r.dead_letter_topic, rd_kafka_err2str(l.last),
      rd_kafka_err2str(l.whole_error));
}

dead_letter_sender::outcome dead_letter_sender::deliver(const std::vector<rejection>& rejected) {
  std::vector<letter> letters;
  for (const auto& r : rejected)
    if (!r.dead_letter_topic.empty()) letters.push_back(letter{&r});
  struct waiting_gauge {
    prometheus::Gauge* g;
    ~waiting_gauge() {
      if (g) g->Set(0);
    }
  } waiting{m_waiting_};
  for (bool first = true;; first = false) {
    if (m_waiting_) {
      m_waiting_->Set(static_cast<double>(
          std::count_if(letters.begin(), letters.end(), [](const letter& l) { return !l.settled; })));
    }
    if (!first) {
      // Only transient failures are left. A stop ends the retries: the batch is then
      // not written, and its records (dead letters included) are read again.
      if (!keep_trying_()) return outcome::interrupted;
      std::this_thread::sleep_for(retry_backoff);
    }
    std::vector<letter*> batch;
    for (auto& l : letters)
      if (!l.settled && l.shape == letter::form::whole) batch.push_back(&l);
    bool complete = send(batch);
    for (auto* l : batch) settle(*l);
    // Those refused in the batch, alone or as envelopes: one at a time, so that each is
    // its own request.
    // A form only moves forward (whole alone, then the envelope, then failed), so this
    // sends each at most twice; a transient failure waits for the next round.
    for (auto& l : letters) {
      while (complete && !l.settled && l.shape != letter::form::whole) {
        auto shape = l.shape;
        complete = send({&l});
        settle(l);
        if (!l.settled && l.shape == shape) break;
      }
    }
    bool all = true;
    for (const auto& l : letters) all = all && l.settled;
    if (all) return outcome::settled;
    if (!complete) return outcome::interrupted;
  }
}

void dead_letter_sender::poll() {
  if (producer_) rd_kafka_poll(producer_, 0);
}

}  // namespace kstate::ingest
