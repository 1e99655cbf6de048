#pragma once
// Shared by the windowed-aggregate integration tests: generated events with known
// timestamps and an independent recount of their windows, following the rules kstate
// documents (docs/windows.md) rather than its code.

#include <algorithm>
#include <random>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "support.h"

namespace kstate::testing {

constexpr int64_t k_base = 1'796'205'600'000;  // 2026-12-02T10:00:00Z
constexpr int64_t k_minute = 60'000;

struct spec {
  int64_t size, advance, grace, retention;
};

struct event {
  std::string key;
  int64_t ts;
  int64_t n;
  int32_t partition = -1;
  int64_t offset = -1;
};

// (key, window start) -> aggregate, with the stream-time rules kstate documents:
// per partition in offset order, stream time = largest event time so far; a window
// takes a record unless start + size + grace <= stream time; a record no window took
// is late; windows with start + size + retention <= final stream time are expired.
struct window_model {
  std::map<std::pair<std::string, int64_t>, int64_t> values;
  std::map<int32_t, int64_t> stream_time;
  int64_t late = 0;
};

// Walks the events per partition in offset order and calls take(event, start) for
// every window that accepts the event; fills the partitions' stream times and counts
// the late events (taken by no window).
template <class Take>
void walk_windows(const std::vector<event>& events, const spec& s, window_model& m, Take take) {
  std::vector<const event*> order;
  for (const auto& e : events) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const event* a, const event* b) {
    return std::tie(a->partition, a->offset) < std::tie(b->partition, b->offset);
  });
  for (const event* e : order) {
    auto& st = m.stream_time.try_emplace(e->partition, -1).first->second;
    st = std::max(st, e->ts);
    bool taken = false;
    // Every aligned start s with s <= ts < s + size, by enumeration from below.
    for (int64_t start = (e->ts / s.advance) * s.advance; start > e->ts - s.size && start >= 0; start -= s.advance) {
      if (start + s.size + s.grace <= st) continue;
      taken = true;
      take(*e, start);
    }
    if (!taken) ++m.late;
  }
}

inline window_model recount(const std::vector<event>& events, const spec& s, bool sum) {
  window_model m;
  walk_windows(events, s, m, [&](const event& e, int64_t start) { m.values[{e.key, start}] += sum ? e.n : 1; });
  return m;
}

// `count` events over `keys` keys ("user-<n>"): event time advances 75 ms per event on
// average; most events are up to 50 s out of order, 3% are 5-15 min behind (late for
// any grace below 5 min). `n` is a number 0..999 (the value {"n": n}).
inline std::vector<event> make_events(int count, int keys, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<event> events;
  int64_t clock = k_base;
  for (int i = 0; i < count; ++i) {
    clock += static_cast<int64_t>(rng() % 150);
    event e;
    e.key = "user-" + std::to_string(rng() % keys);
    e.ts = clock - static_cast<int64_t>(rng() % 50'000);
    if (rng() % 100 < 3) e.ts = clock - 300'000 - static_cast<int64_t>(rng() % 600'000);
    e.n = static_cast<int64_t>(rng() % 1000);
    events.push_back(std::move(e));
  }
  return events;
}

inline std::vector<produced> to_records(const std::vector<event>& events) {
  std::vector<produced> records;
  for (const auto& e : events) records.push_back({e.key, "{\"n\":" + std::to_string(e.n) + "}", e.ts});
  return records;
}

}  // namespace kstate::testing
