#pragma once
// run_batch_loop (internal to ingest): the poll → batch → write loop that the owner's
// engine and the standby copies share, so both apply records alike: each consumed
// message becomes a `record` (key, value, timestamp) fed to one batch_builder, and the
// batch is written when it holds `max_batch_records` records, when its first record is
// `max_batch_delay` old, or when the consumer has nothing more to give. What differs
// between the two (what a write does, which records are kept, the periodic work) comes
// in as hooks.
//
// Threading: runs on the calling thread (the consumer's owner), and so do the hooks.

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "ingest/batch_builder.h"

namespace kstate::ingest {

struct batch_loop_options {
  std::string name;                               // the consumer, in log lines and errors ("standby consumer")
  size_t max_batch_records = 10'000;              // ingest_config::max_batch_records
  std::chrono::milliseconds max_batch_delay{50};  // ingest_config::max_batch_delay
  int idle_poll_ms = 100;                         // how long a poll waits when nothing is pending
};

// Every hook but `write` may be empty. A hook's error ends the loop and is returned.
struct batch_loop_hooks {
  // At the start of each turn, before the poll: the caller's periodic work.
  std::function<status()> each_turn;
  // Whether a consumed record is applied (empty: all are). The record borrows the
  // message's bytes for the duration of the call.
  std::function<bool(const record&)> accept;
  // After the builder took an accepted record.
  std::function<status(const record&)> after_add;
  // The consumer reached the end of a partition; `end` is the offset after its last
  // record. Needs enable.partition.eof.
  std::function<status(const std::string& topic, int32_t partition, int64_t end)> at_end;
  // Writes the builder's pending batch and what the caller holds (`held`; at least one
  // record is pending in either). Must leave both empty, or they are written again.
  std::function<status()> write;
  // A poll returned nothing (before a pending batch is written).
  std::function<void()> idle;
  // True while the caller has work of its own for each turn (a restore): the poll then
  // returns at once instead of waiting for records.
  std::function<bool()> busy;
  // Takes a message the caller applies itself instead of the builder (returns true),
  // e.g. a changelog record, whose headers matter; called before `accept`.
  std::function<bool(const rd_kafka_message_t* m)> take;
  // What the caller took and holds unwritten, counted with the builder's pending
  // records for the batch limits; `write` then writes it too.
  std::function<size_t()> held;
};

// Runs while `running` is true, or until a hook fails or the consumer reports a fatal
// error (returned as `unavailable`). Other consumer errors are logged as warnings and
// skipped. A batch still pending when `running` turns false is left in the builder for
// the caller to write or drop.
status run_batch_loop(rd_kafka_t* consumer, batch_builder& builder, const std::atomic<bool>& running,
                      const batch_loop_options& options, const batch_loop_hooks& hooks);

}  // namespace kstate::ingest
