#pragma once
// ingest::engine: the consumer loop that keeps every view current.
//
// One librdkafka consumer in the group `application_id` (cooperative-sticky assignor)
// subscribed to every view's source topic. Records are applied in batches: one RocksDB
// write per batch holding the state changes and each touched partition's next offset.
// On assignment a partition resumes from the offset stored in RocksDB (from the
// beginning when none); offsets committed to the group are for monitoring only. On
// revocation the pending batch is written before the partitions are released.
//
// Threading: start() spawns the ingest thread, which owns the consumer, the dead-letter
// producer and the batch being built, and the writer thread, which writes the built
// batches in order (the ingest thread goes on polling meanwhile; a full writer queue
// pauses fetching); stop() joins both. Stats are atomics, readable from any thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/json_check.h"
#include "core/notifier.h"
#include "core/ownership.h"
#include "core/status.h"
#include "core/view.h"
#include "ingest/changes.h"
#include "storage/db.h"

namespace prometheus {
class Registry;
}

namespace kstate::ingest {

struct ingest_config {
  // Kafka bootstrap servers, e.g. "127.0.0.1:9092".
  std::string bootstrap_servers;
  // Consumer group id and prefix of topics kstate creates.
  std::string application_id;
  // client.id reported to the brokers. Default "kstate".
  std::string client_id = "kstate";
  // HTTP endpoint other instances reach this one at, e.g. "http://10.0.0.5:8080";
  // carried in the consumer's client.id so group metadata names it (see
  // ingest/membership.h). Empty: not advertised (the client.id is client_id alone).
  std::string advertised_endpoint;
  // Aggregate views: true (exactly_once, the default) commits outputs and input
  // offsets in one Kafka transaction; false (at_least_once) commits the offsets after
  // the outputs were acknowledged, so a crash may count records twice.
  bool exactly_once = true;
  // Stable identity of this instance's state directory (storage::db::instance_id);
  // the transactional.id is "<application_id>-<instance_id>". Required for
  // exactly_once aggregates.
  std::string instance_id;
  // Static group membership (KIP-345): the consumer joins its group with
  // group.instance.id "<application_id>-<member_name>" (member_name empty:
  // instance_id), so a restarted instance (after kill -9 or SIGTERM) takes its
  // partitions back at once, without a rebalance; a member that does not come back
  // within session.timeout.ms leaves the group then. A `kafka: group.instance.id`
  // replaces the derived id. Default true.
  bool static_membership = true;
  // The name of this instance in its group when it has one that is unique by
  // configuration (the server uses the advertised endpoint, which peers forward to):
  // it survives a lost or emptied state directory, which instance_id does not.
  std::string member_name;
  // transaction.timeout.ms of the transactional producer: how long a transaction left
  // open by a crashed instance blocks read_committed readers. Default 10 s.
  std::chrono::milliseconds transaction_timeout{10'000};
  // Extra librdkafka properties, passed verbatim to the consumer and producer.
  std::map<std::string, std::string> kafka;
  // Most records applied in one RocksDB write. Default 10,000.
  int max_batch_records = 10'000;
  // Longest a consumed record waits before its batch is written. Default 50 ms.
  std::chrono::milliseconds max_batch_delay{50};
  // Most bytes of built batches waiting for the writer thread; when reached, the ingest
  // thread waits for room before it takes more records from the consumer. Default 16 MiB.
  size_t max_queued_bytes = size_t{16} << 20;
  // How often positions are committed to the group for monitoring. Default 1 s.
  std::chrono::milliseconds commit_interval{1'000};
  // How long start() waits for topic metadata and dead-letter topics. Default 30 s.
  std::chrono::milliseconds startup_timeout{30'000};
  // Deepest nesting of arrays and objects accepted in a record's JSON key or value
  // (json views) and in what aggregates parse; deeper records are invalid (counted,
  // dead-lettered). See core/json_check.h. Default 128.
  int max_json_depth = default_max_json_depth;
  // Called on the ingest thread at the end of every rebalance callback, after the
  // assignment changed (e.g. membership_watcher::refresh_soon). Must not block. May be
  // empty.
  std::function<void()> on_rebalance;
  // Called on the ingest thread with newly assigned partitions before their stored
  // positions are read (the standby engine releases them here, so the owner resumes
  // where the copy stopped, and no write of the copy can follow). May be empty.
  std::function<void(const std::vector<std::pair<std::string, int32_t>>&)> before_assign;
  // Called on the ingest thread with revoked partitions once this engine writes nothing
  // more of them (the standby engine may copy them again). May be empty.
  std::function<void(const std::vector<std::pair<std::string, int32_t>>&)> after_revoke;
  // The standby engine: how long release() waits for the copy to write what it holds
  // of a partition taken over. Past it the owner goes on from the stored position, and
  // the copy's pending write is dropped. Default 10 s.
  std::chrono::milliseconds standby_release_timeout{10'000};
  // Hears of every change the owner writes to an observed view (ingest/changes.h), on
  // the writer thread. Null (the default): nobody observes, nothing is decoded.
  std::shared_ptr<change_observer> changes;
};

struct ingest_stats {
  std::atomic<uint64_t> consumed{0};       // records received from Kafka
  std::atomic<uint64_t> applied{0};        // record x view applications written
  std::atomic<uint64_t> invalid{0};        // records a view rejected
  std::atomic<uint64_t> dead_lettered{0};  // rejections delivered to a dead-letter topic (whole or as an envelope)
  std::atomic<uint64_t> dead_letters_truncated{0};  // of those, delivered as an envelope
  std::atomic<uint64_t> dead_letters_failed{0};     // rejections not delivered, not even as an envelope
  std::atomic<uint64_t> batches{0};                 // RocksDB writes
  std::atomic<uint64_t> rebalances{0};              // assignment changes
  std::atomic<uint64_t> restored{0};                // changelog records applied to local stores
  std::atomic<uint64_t> aborted{0};                 // transactions aborted (consumer rewound)
  std::atomic<uint64_t> fetcher_wakeups{0};         // requests sent to wake librdkafka's fetcher
};

// Checks extra librdkafka properties the way the consumer will set them; the error
// names the first property librdkafka does not know or refuses.
status check_kafka_properties(const std::map<std::string, std::string>& props);

// "major.minor.patch" of the linked librdkafka.
std::string librdkafka_version();

class engine {
 public:
  // All references must outlive the engine. `metrics` and `notifier` may be null; the
  // notifier hears of every write that moved a position.
  engine(ingest_config cfg, std::vector<view_def> views, storage::db& db, ownership_registry& ownership,
         prometheus::Registry* metrics, change_notifier* notifier = nullptr);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // Creates the consumer (and the dead-letter producer if any view has one), checks
  // that the source and dead-letter topics exist, subscribes and starts the thread.
  // Errors name the bad property or missing topic.
  status start();
  // Writes the pending batch, commits positions to the group, leaves the group and
  // joins the thread. Idempotent.
  void stop();
  // Makes a start() that is still waiting for Kafka give up promptly. Any thread.
  void abort_start();

  const ingest_stats& stats() const;
  // Fatal error that stopped the loop (empty while healthy).
  std::string fatal_error() const;
  // True when that error is the group fencing this static member
  // (FENCED_INSTANCE_ID): librdkafka rejoins with a new member id after losing its
  // session (a broker or coordinator outage longer than session.timeout.ms), and an
  // OffsetCommit or heartbeat still carrying the old one is fenced. The consumer is
  // then unusable, but a new engine on the same stores can rejoin. The same holds when
  // the transactional producer of exactly-once aggregates fails for good (an abort the
  // broker refuses after a network cut): a new one fences it, and the batch is read
  // again from the committed offsets.
  bool fenced() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace kstate::ingest
