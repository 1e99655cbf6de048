#pragma once
// change_observer: how an embedding application hears of the changes this instance's
// owner applies to its views (the embedding library's change listeners, kstate/kstate.h).
//
// The writer thread (ingest/src/apply_stage.h) asks any() once per batch; only when it
// is true does it decode the batch, read the old value of each changed key of an
// observed view (before the write, from the same store, so old and new are consecutive
// states), write, and hand the changes to applied(). Nobody observing costs one call
// per batch.
//
// Only the owner's writes are observed: what a standby copies, what a restore reads
// back from a changelog and what a bootstrap installs are copies of changes already
// applied by some owner, not new changes.
//
// Threading: any() and observes() are called on the writer thread and must be cheap;
// applied() runs on the writer thread too, after the write, and may block: ingest then
// waits (its writer's queue fills and fetching pauses), which is how a slow observer
// pushes back. applied() must return once the engine is stopping (the observer is
// closed before or during engine::stop()), or the stop waits for it.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kstate::ingest {

// One key's change in one applied batch: its value before the batch and after it.
struct applied_change {
  std::string view;
  int32_t partition = -1;
  // The record key (an aggregate's group key) as stored, serialized bytes.
  std::string key;
  // Windowed views: the start of the key's window (ms since the epoch).
  std::optional<int64_t> window_start;
  std::optional<std::string> old_value;  // nullopt: the key was absent
  std::optional<std::string> new_value;  // nullopt: the batch deleted the key
  // Offset of the record that wrote new_value (-1 for a delete).
  int64_t offset = -1;
  // The partition's position once the batch is written: the next offset it reflects.
  int64_t next_offset = -1;
};

class change_observer {
 public:
  virtual ~change_observer() = default;
  // True while any view is observed.
  virtual bool any() const = 0;
  // True when changes of `view` are wanted.
  virtual bool observes(std::string_view view) const = 0;
  // The changes of observed views in one written batch, in the batch's order (by view,
  // partition and key; a key at most once). Called after the write.
  virtual void applied(std::vector<applied_change> changes) = 0;
};

}  // namespace kstate::ingest
