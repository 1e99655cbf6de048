#pragma once
// ownership_registry: which partitions of which topics this instance owns and whether
// each has caught up, published by ingest and read by query and the server.
//
// Thread safety: every member is safe to call from any thread. Writers (the ingest
// thread) replace per-topic entries under a mutex; readers copy what they need.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace kstate {

struct partition_state {
  bool assigned = false;
  // High watermark seen when the partition was assigned: the partition is ready once
  // its applied position reaches it. -1 while unknown.
  int64_t catch_up_target = -1;
  bool ready = false;
  // Next offset applied here, and the partition's high watermark as last seen by the
  // consumer (-1 while unknown). Lag = high_watermark - applied.
  int64_t applied = -1;
  int64_t high_watermark = -1;
  // Restore of an aggregate's changelog partition into this partition's store:
  // changelog records applied so far and how many there are to apply (-1: no restore
  // running or done since the assignment).
  int64_t restored = 0;
  int64_t restore_total = -1;
  // Where the partition resumed when it was assigned (-1: unknown) and when: the catch-up
  // rate so far, for catch_up() below.
  int64_t assigned_from = -1;
  std::chrono::steady_clock::time_point assigned_at{};
};

// Where a partition that is not ready yet stands in its catch-up to the end it had at
// assignment (partition_state::catch_up_target).
struct catch_up_progress {
  int64_t position = 0;               // next offset applied
  int64_t target = 0;                 // ready once position reaches it
  int64_t left = 0;                   // offsets still to apply
  double records_per_second = 0;      // offsets applied per second since the assignment
  std::optional<double> eta_seconds;  // left at that rate; none before anything was applied
};
// nullopt when the partition is ready, not assigned, or its target or position unknown.
std::optional<catch_up_progress> catch_up(const partition_state& p, std::chrono::steady_clock::time_point now);

struct topic_state {
  int32_t partition_count = 0;                    // 0 until metadata is known
  std::map<int32_t, partition_state> partitions;  // only partitions ever assigned
};

class ownership_registry {
 public:
  void set_partition_count(const std::string& topic, int32_t count);
  struct assignment {
    std::string topic;
    int32_t partition;
    int64_t catch_up_target;
    bool ready;            // already caught up when assigned
    int64_t applied = -1;  // the position it resumes from (-1: unknown)
  };
  // Records a rebalance's new partitions in one step (readers never see half of it)
  // and marks the instance joined.
  void assign(const std::vector<assignment>& added);
  void revoke(const std::string& topic, int32_t partition);
  void mark_ready(const std::string& topic, int32_t partition);
  // Progress of an assigned partition (ingest updates it about once a second).
  void update_progress(const std::string& topic, int32_t partition, int64_t applied, int64_t high_watermark);
  // Progress of a changelog restore of an assigned partition (ingest, any time).
  void update_restore(const std::string& topic, int32_t partition, int64_t restored, int64_t total);
  void revoke_all();
  // Called on every rebalance callback, even one that assigns nothing: an instance
  // with no partitions (more instances than partitions) is still ready.
  void mark_joined();

  std::optional<topic_state> topic(const std::string& topic) const;
  // One partition's state (nullopt when it was never assigned here), without copying
  // the topic's whole map: for the per-request checks of point lookups.
  std::optional<partition_state> partition(const std::string& topic, int32_t partition) const;
  int32_t partition_count(const std::string& topic) const;
  // True when the partition is assigned here and has caught up.
  bool serves(const std::string& topic, int32_t partition) const;
  // True when every assigned partition of every topic has caught up, the consumer has
  // joined its group (mark_joined), and ingest can write (no write failure).
  bool all_ready() const;
  // Increments on every assignment change; lets readers notice a rebalance.
  uint64_t generation() const;
  // Why ingest cannot write the state directory (disk full, read-only), while it
  // cannot; empty once writes work again. Reads go on; the instance is not ready.
  void set_write_failure(std::string why);
  std::string write_failure() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, topic_state> topics_;
  std::string write_failure_;
  bool joined_ = false;
  uint64_t generation_ = 0;
};

}  // namespace kstate
