#pragma once
// membership_watcher: partition -> owner, read from the Kafka consumer group itself.
//
// Every kstate instance is a member of the consumer group `application_id`, and the
// group coordinator is the one authority on who owns which partition. The watcher asks
// it (ListGroups and DescribeGroups, through rd_kafka_list_groups) and publishes the answer to a
// membership_registry, where query/server read it to route requests. Each member's
// advertised HTTP endpoint travels in its consumer's client.id (see
// encode_member_client_id), so the group description alone names every owner's
// address: no static peer list, no gossip, no extra topic. docs/cluster.md says why.
//
// Threading: start() creates one librdkafka handle (used only for admin requests) and
// one thread that owns it; stop() joins it. refresh_soon() may be called from any
// thread, including the ingest thread's rebalance callback: it only sets a flag.
// The registry must outlive the watcher.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/membership.h"
#include "core/status.h"
#include "ingest/engine.h"

namespace kstate::ingest {

struct membership_config {
  // How often the group is described when nothing prompts it. Default 5 s.
  std::chrono::milliseconds refresh_interval{5'000};
  // How often the group is described while a rebalance is in progress
  // (PreparingRebalance, CompletingRebalance), so readers stop getting 503 soon after
  // it settles. Default 500 ms.
  std::chrono::milliseconds unsettled_interval{500};
  // Timeout of one description of the group. stop() waits for one in flight, at most
  // this long (only when the brokers do not answer). Default 5 s.
  std::chrono::milliseconds request_timeout{5'000};
};

// Watches the group `kafka_cfg.application_id`, publishing each change to `registry`.
class membership_watcher {
 public:
  // Uses kafka_cfg's bootstrap servers, application id, client id and `kafka`
  // properties (the same security settings the consumer uses).
  membership_watcher(const ingest_config& kafka_cfg, membership_config cfg, membership_registry& registry);
  ~membership_watcher();
  membership_watcher(const membership_watcher&) = delete;
  membership_watcher& operator=(const membership_watcher&) = delete;

  // Creates the admin handle and starts the thread, which describes the group at once.
  // Fails only on a bad librdkafka property (named in the message); an unreachable
  // broker is not an error here: it is logged and retried on every tick.
  status start();
  // Asks for a refresh now. Calls made while a refresh is pending or running are
  // coalesced into one more refresh. Any thread; never blocks; harmless before start()
  // and after stop(). Meant for ingest_config::on_rebalance, which runs until the
  // engine is stopped: stop the engine before destroying the watcher.
  void refresh_soon();
  // Stops the thread and destroys the handle. Idempotent. Waits for a description in
  // flight: at most the request timeout, and only when the brokers do not answer.
  void stop();

  // Describe requests that failed (coordinator unavailable, timeouts, ...).
  uint64_t failed_refreshes() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// The client.id a member reports: `client_id` followed by ";endpoint=" and `endpoint`.
// In both parts the characters ';' and '%', and any byte outside printable ASCII, are
// percent-encoded, so the one unescaped ';' separates them unambiguously; a usual
// endpoint such as "http://10.0.0.5:8080" is carried verbatim and stays readable in
// Kafka's own tools. An empty endpoint leaves `client_id` (escaped) alone.
std::string encode_member_client_id(const std::string& client_id, const std::string& endpoint);
// The endpoint carried by a client.id made by encode_member_client_id; nullopt when
// the client id carries none (another kind of client in the group) or is malformed.
std::optional<std::string> endpoint_from_client_id(const std::string& client_id);
// The (topic, partition) pairs of a consumer-protocol member assignment as a group
// description carries it (ConsumerProtocolAssignment bytes, any version); nullopt when
// the bytes are malformed.
std::optional<std::vector<std::pair<std::string, int32_t>>> decode_consumer_assignment(const void* data, size_t size);

}  // namespace kstate::ingest
