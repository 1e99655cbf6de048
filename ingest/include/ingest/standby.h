#pragma once
// standby_engine: keeps copies of partitions this instance does not own current, so
// that when their owner fails the new owner (often this instance) serves at once, and
// allow_stale reads have a recent copy.
//
// Which partitions: for every partition, the `replicas` members that follow its owner
// in the group (members ordered by endpoint) keep a standby copy. The choice is read
// from the group membership, so every instance computes the same answer.
//
// How: a second librdkafka consumer with plain assign (no group), running the owner's
// batch loop: one RocksDB batch holds the state changes and the partition's next
// offset, records keep their timestamps, and only what a write does differs.
// Aggregate views (windowed, session and join views included) are copied from their
// changelog topics instead (read_committed), each record applied as a changelog
// restore applies it (changelog_apply.h); one batch holds the state, the changelog
// position and stream time, and, when the copy reached the changelog's end, the
// store-topic position the copy reflects (the largest kstate.offset + 1 applied). A new
// owner's restore then starts at that changelog position and reads only the tail.
// Which partitions: those of each view's store topic (an aggregate's repartition topic
// when it is re-keyed), as the group assigns them. A foreign-key join has two store
// topics, its repartition topic (the left rows, from the view's changelog) and its
// subscription topic (the right side, from the subscription changelog): each partition
// of either is a copy of its own, with its own changelog position, hand-over and claim.
//
// Hand-over: before the group consumer takes a partition over, it calls release(),
// which claims the partition and waits (at most ingest_config::standby_release_timeout)
// for the copy to write what it holds of it and stop consuming it, so the owner resumes
// where the copy stopped. The claim is a fence: every write of the copies
// happens under the mutex release() claims under, and a batch touching a claimed
// partition is dropped (the kept partitions then resume from their stored positions).
// So once release() returned, in time or not, no write of the copy lands for those
// partitions. give_back() lifts the claim when the owner gave the partitions up.
//
// Failure: a failed write or an exception on the standby thread stops the copies (a
// critical log line, kstate_standby_failures_total), never the process.
//
// Threading: start() spawns one thread owning the consumer; release(), give_back() and
// partitions() may be called from any thread.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/membership.h"
#include "core/notifier.h"
#include "core/ownership.h"
#include "core/status.h"
#include "core/view.h"
#include "ingest/engine.h"
#include "storage/db.h"

namespace prometheus {
class Registry;
}

namespace kstate::ingest {

// The endpoints keeping standby copies of (topic, partition): the `replicas` members
// after its owner, members ordered by endpoint, never the owner itself.
std::vector<std::string> standbys_for(const cluster_snapshot& group, const std::string& topic, int32_t partition,
                                      int replicas);

class standby_engine {
 public:
  // References must outlive the engine; `notifier` and `metrics` may be null.
  standby_engine(ingest_config cfg, std::vector<view_def> views, storage::db& db, const ownership_registry& ownership,
                 const membership_registry& membership, std::string self_endpoint, int replicas,
                 change_notifier* notifier, prometheus::Registry* metrics = nullptr);
  ~standby_engine();
  status start();
  void stop();
  // The owner takes `parts` over (ingest_config::before_assign): claims them, and
  // waits until the copy wrote what it consumed of them and stopped consuming them, or
  // standby_release_timeout passed (logged; the copy's pending write of them is then
  // dropped). Either way, when it returns no write of the copy for `parts` can land
  // until give_back(). A write of the copy in progress is waited for: it cannot be
  // undone.
  void release(const std::vector<std::pair<std::string, int32_t>>& parts);
  // The owner writes nothing more of `parts` (ingest_config::after_revoke): the copy
  // may keep them again, from their stored positions.
  void give_back(const std::vector<std::pair<std::string, int32_t>>& parts);
  // The partitions currently kept as standby copies.
  std::vector<std::pair<std::string, int32_t>> partitions() const;
  // The high watermark of a standby partition as its consumer last fetched it.
  std::optional<int64_t> high_watermark(const std::string& topic, int32_t partition) const;

  // Test only: called on the standby thread, holding no lock, with the partitions a
  // batch of the copies touches, before the thread's loop writes that batch (not before
  // a hand-over's own write), so a test can hold a write back past a hand-over. Set
  // before start(); never set in production, where the empty function costs one test
  // per batch.
  using write_hook = std::function<void(const std::vector<std::pair<std::string, int32_t>>& partitions)>;
  void set_before_write_for_testing(write_hook hook);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace kstate::ingest
