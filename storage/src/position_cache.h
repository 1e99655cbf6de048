#pragma once
// position_cache: the stored position of each (view, partition), kept in memory beside
// RocksDB so that a lookup reads one key instead of two.
//
// db::get must answer a value with the position of the state it was read from
// (DESIGN.md, invariant 3). Reading both in one RocksDB MultiGet gives that, at about
// 40% more instructions than reading the value alone. Here every write that changes a
// position publishes it with a sequence lock: a writer counts itself in (`writing`),
// writes to RocksDB, stores the new position, bumps `version` and counts itself out. A
// reader that finds no writer and the same version before and after its value read
// knows no position changed while it read, so the value is the state of the position it
// loaded before reading. Any other reader falls back to the MultiGet.
//
// All operations are sequentially consistent: with RocksDB publishing a write's sequence
// number with release and reading it with acquire, a reader whose Get saw a write's data
// then sees that write's `writing` count or its `version` bump.
//
// Slots are created by writers only (a chunk of 256 at a time, never freed while the db
// is open); partitions from 2^17 on are not cached (their lookups take the MultiGet).

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace kstate::storage {

class position_cache {
 public:
  // A position no one published yet (or a write that failed): readers fall back.
  static constexpr int64_t unknown = -1;
  // Published: the partition has no stored position.
  static constexpr int64_t absent = -2;

  struct slot {
    std::atomic<uint32_t> writing{0};
    std::atomic<uint64_t> version{0};
    std::atomic<int64_t> position{unknown};
  };

  explicit position_cache(std::size_t views) : views_(views) {}
  position_cache(const position_cache&) = delete;
  position_cache& operator=(const position_cache&) = delete;

  // The slot of (view, partition) if a writer made it; null otherwise. Never blocks.
  slot* find(std::size_t view, int32_t partition) const {
    if (view >= views_.size() || partition < 0 || partition >= max_partitions) return nullptr;
    chunk* c = views_[view].chunks[static_cast<std::size_t>(partition) / chunk_size].load();
    return c ? &(*c)[static_cast<std::size_t>(partition) % chunk_size] : nullptr;
  }

  // The slot of (view, partition), made if needed; null when it cannot be cached.
  slot* make(std::size_t view, int32_t partition) {
    if (view >= views_.size() || partition < 0 || partition >= max_partitions) return nullptr;
    auto& cell = views_[view].chunks[static_cast<std::size_t>(partition) / chunk_size];
    if (!cell.load()) {
      std::lock_guard lock(mu_);
      if (!cell.load()) {
        owned_.push_back(std::make_unique<chunk>());
        cell.store(owned_.back().get());
      }
    }
    return &(*cell.load())[static_cast<std::size_t>(partition) % chunk_size];
  }

  // Writer side: begin() before the RocksDB write, end() after it with the position the
  // write left (unknown when it failed or cannot be told).
  static void begin(slot& s) { s.writing.fetch_add(1); }
  static void end(slot& s, int64_t position) {
    s.position.store(position);
    s.version.fetch_add(1);
    s.writing.fetch_sub(1);
  }

  // Reader side: a ticket taken before reading the value, checked after it.
  struct ticket {
    const slot* s = nullptr;
    uint64_t version = 0;
    int64_t position = unknown;
  };
  // A ticket for (view, partition), or nullopt when the position cannot be trusted now
  // (no slot, nothing published, or a write in progress).
  std::optional<ticket> enter(std::size_t view, int32_t partition) const {
    const slot* s = find(view, partition);
    if (!s) return std::nullopt;
    ticket t{s, s->version.load(), unknown};
    if (s->writing.load() != 0) return std::nullopt;
    t.position = s->position.load();
    if (t.position == unknown) return std::nullopt;
    return t;
  }
  // Whether no write touched the position since enter(): then the value read in between
  // belongs to t.position.
  static bool still(const ticket& t) { return t.s->writing.load() == 0 && t.s->version.load() == t.version; }

 private:
  static constexpr std::size_t chunk_size = 256;
  static constexpr int32_t max_partitions = 1 << 17;
  using chunk = std::array<slot, chunk_size>;
  struct view_slots {
    std::array<std::atomic<chunk*>, max_partitions / chunk_size> chunks{};
  };

  std::vector<view_slots> views_;
  std::mutex mu_;  // making chunks
  std::vector<std::unique_ptr<chunk>> owned_;
};

}  // namespace kstate::storage
