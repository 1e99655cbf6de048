#pragma once
// dead_letter_sender (internal to ingest): produces a batch's rejected records to their
// views' dead-letter topics and reports when every one of them is settled, so the
// engine writes the batch (and moves its positions past them) only then.
//
// A dead letter is settled when Kafka acknowledged it whole, or, when the whole record
// cannot be produced for a reason that retrying cannot change, acknowledged a bounded
// envelope instead (the key if it fits, the first `envelope_bytes` of the value,
// headers saying so), or, when even the envelope cannot be produced, once it is counted
// (kstate_ingest_dead_letters_failed_total) and logged. Transient failures are retried;
// only a shutdown interrupts them, and then the batch is not written (its records are
// read again at the next start). Which librdkafka errors are which: classify() in
// dead_letters.cc; docs/operations.md says the same for operators.
//
// Threading: one thread at a time (the ingest thread, or stop() after joining it);
// delivery reports are served by poll() and deliver() on that thread.

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "ingest/batch_builder.h"
#include "ingest/engine.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
class Gauge;
}  // namespace prometheus

namespace kstate::ingest {

class dead_letter_sender {
 public:
  // Hears the producer's error callback (e.g. authentication failures).
  using error_fn = std::function<void(rd_kafka_resp_err_t, const char* reason)>;
  // Whether transient failures are still worth retrying (false once a stop began).
  using keep_trying_fn = std::function<bool()>;

  // Bytes of the value (and the most bytes of the key) an envelope carries.
  static constexpr size_t envelope_bytes = 1024;

  // `cfg` (the connection and `kafka:` properties of each producer created), `stats`
  // and `metrics` (may be null) outlive the sender.
  dead_letter_sender(const ingest_config& cfg, error_fn on_error, keep_trying_fn keep_trying, ingest_stats& stats,
                     prometheus::Registry* metrics);
  ~dead_letter_sender();
  dead_letter_sender(const dead_letter_sender&) = delete;
  dead_letter_sender& operator=(const dead_letter_sender&) = delete;

  // Creates the producer (idempotent: librdkafka's own retries never duplicate a dead
  // letter).
  status start();
  // The producer, for metadata requests at start. Valid until the next deliver().
  rd_kafka_t* handle() const { return producer_; }

  enum class outcome {
    settled,      // every dead letter is delivered, delivered as an envelope, or counted as failed
    interrupted,  // a stop began while a transient failure was being retried: write nothing
  };
  // Settles the dead letters among `rejected` (those naming a dead-letter topic).
  outcome deliver(const std::vector<rejection>& rejected);
  // Serves delivery reports of dead letters given up at a stop (they change nothing).
  void poll();

 private:
  struct letter;
  enum class failure { transient, too_large, permanent };
  static failure classify(rd_kafka_resp_err_t err);
  static const char* reason_label(rd_kafka_resp_err_t err);

  status create_producer();
  void replace_producer_if_fatal();
  rd_kafka_resp_err_t produce(const letter& l, uintptr_t tag);
  // Produces `group` and waits for each one's delivery report. False when a stop began
  // and the wait was given up (the letters not reported count as transient failures).
  bool send(const std::vector<letter*>& group);
  void settle(letter& l);

  const ingest_config& cfg_;
  error_fn on_error_;
  keep_trying_fn keep_trying_;
  ingest_stats& stats_;
  rd_kafka_t* producer_ = nullptr;
  // Delivery reports of the current send(): the message opaque is (round << 32) | index,
  // so reports of an earlier, abandoned round are told apart and ignored.
  uint32_t round_ = 0;
  std::vector<rd_kafka_resp_err_t> reports_;
  std::vector<bool> reported_;
  size_t outstanding_ = 0;

  prometheus::Family<prometheus::Counter>* m_dead_lettered_ = nullptr;
  prometheus::Family<prometheus::Counter>* m_truncated_ = nullptr;
  prometheus::Family<prometheus::Counter>* m_failed_ = nullptr;
  // Dead letters of the current batch not settled yet (0 between batches).
  prometheus::Gauge* m_waiting_ = nullptr;
  // When a transient failure was last logged (one line per wait_log_interval).
  std::chrono::steady_clock::time_point last_transient_log_{};

  friend void dead_letter_report(rd_kafka_t*, const rd_kafka_message_t*, void*);
};

}  // namespace kstate::ingest
