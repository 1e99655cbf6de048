#pragma once
// Copies of one partition of one view, sent to another instance of the group that takes
// the partition over without its state (DESIGN.md invariant 8), and installed there.
//
// The sender (snapshot_sender) reads through one RocksDB snapshot, so the entries and
// the positions it reports describe the same instant. A copy travels in pages over the
// instances' signed channel (the internal routes `/v1/stores/{store}/partitions/{p}/
// snapshot`, docs/cluster.md): a probe that says which positions the copy would reflect,
// an open that takes the snapshot and starts a session, then the pages in order. A page
// body is a sequence of frames, each
//
//   key length (4 bytes, big-endian) | value length (4 bytes, big-endian) | key | value
//
// (the record key without its partition, and the value as stored). The top two bits of
// the key length say which column family a frame belongs to (snapshot_frame): the
// view's own entries come first, then a versioned view's versions, then a join view's
// sides. The last page says so and carries the entry count and the XXH64 (seed 0) of
// every page body in order, and for a join view the number of side frames; the receiver
// installs the copy only when all of them match what it received.
//
// Thread safety: every member function may be called from any thread.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/view.h"
#include "storage/db.h"

namespace kstate::server {

// Positions as a copy reflects them: (name, next offset), the view's own first.
using view_positions = std::vector<std::pair<std::string, int64_t>>;

struct snapshot_page {
  std::string body;  // frames
  uint64_t entries = 0;
  bool last = false;
  // On the last page: entries of the whole copy and the XXH64 of all page bodies.
  uint64_t total_entries = 0;
  uint64_t digest = 0;
  // On the last page of a join view's copy: its side frames (of total_entries).
  std::optional<uint64_t> total_sides;
};

struct snapshot_sender_limits {
  // Copies being sent at once; more are refused (busy) until one ends.
  size_t max_sessions = 4;
  // Bytes of frames per page (a page holds at least one entry).
  size_t page_bytes = 4 << 20;
  // A session not asked for a page this long is dropped with its RocksDB snapshot.
  std::chrono::milliseconds idle{30'000};
};

class snapshot_sender {
 public:
  // `views`: the configured views, so that a join view's copies carry its sides.
  snapshot_sender(const storage::db& db, snapshot_sender_limits limits = {}, const std::vector<view_def>& views = {});
  ~snapshot_sender();

  // True when copies of `view` carry a join view's sides (side frames, and the count of
  // them on the last page).
  bool carries_sides(std::string_view view) const;

  // The positions a copy of (view, partition) taken now would reflect; empty when this
  // instance holds no state of it. not_found: no such view.
  result<view_positions> positions(std::string_view view, int32_t partition) const;

  struct offer {
    std::string session;
    view_positions positions;
  };
  // Takes the snapshot a copy is read from. not_found: no such view, or no state of the
  // partition here; resource_exhausted: max_sessions copies are being sent.
  result<offer> open(std::string_view view, int32_t partition);

  // Page `n` (from 0) of a session. Asking for the page just returned again returns it
  // again (a retried request); any other page but the next is invalid_argument.
  // not_found: no such session (never opened, expired or ended).
  result<snapshot_page> read(const std::string& session, uint64_t n);

  size_t open_sessions() const;

 private:
  struct session;
  void drop_idle(std::chrono::steady_clock::time_point now);  // under mu_

  const storage::db& db_;
  snapshot_sender_limits limits_;
  std::map<std::string, storage::view_id, std::less<>> sides_;  // join view -> its sides
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<session>> sessions_;  // guarded by mu_
};

// What a frame holds: an entry of the view, a stored version of a versioned view
// (storage::snapshot::scan_versions), or a join view's sides of a key (the entry of the
// column family join_sides_name()).
enum class snapshot_frame { entry, version, side };

// Appends one frame to `out`. Keys are shorter than 2^30 bytes (Kafka's message size
// bounds them far below): the top two bits of the length are the frame's kind.
void append_snapshot_frame(std::string& out, std::string_view key, std::string_view value,
                           snapshot_frame kind = snapshot_frame::entry);

// The top bits of a frame's key length: the frame holds a stored version, or sides.
inline constexpr uint32_t snapshot_version_flag = 0x80000000u;
inline constexpr uint32_t snapshot_side_flag = 0x40000000u;

// Splits a page body into frames, calling `each(key, value)` for every one, or
// `each(key, value, kind)` when `each` takes the kind (an `each` that does not is given
// entries only: another kind is invalid_argument); invalid_argument when the body does
// not end on a frame boundary or a frame has both kind bits.
template <typename F>
status for_each_snapshot_frame(std::string_view body, F&& each) {
  auto u32 = [](const char* p) {
    return (static_cast<uint32_t>(static_cast<unsigned char>(p[0])) << 24) |
           (static_cast<uint32_t>(static_cast<unsigned char>(p[1])) << 16) |
           (static_cast<uint32_t>(static_cast<unsigned char>(p[2])) << 8) |
           static_cast<uint32_t>(static_cast<unsigned char>(p[3]));
  };
  size_t at = 0;
  while (at < body.size()) {
    if (body.size() - at < 8) return status::invalid_argument("snapshot page: a frame header is cut short");
    const uint32_t head = u32(body.data() + at);
    const bool version = (head & snapshot_version_flag) != 0, side = (head & snapshot_side_flag) != 0;
    if (version && side) return status::invalid_argument("snapshot page: a frame of two kinds");
    const snapshot_frame kind = version ? snapshot_frame::version : side ? snapshot_frame::side : snapshot_frame::entry;
    uint64_t klen = head & ~(snapshot_version_flag | snapshot_side_flag), vlen = u32(body.data() + at + 4);
    at += 8;
    if (body.size() - at < klen + vlen) return status::invalid_argument("snapshot page: a frame is cut short");
    status s;
    if constexpr (std::is_invocable_v<F, std::string_view, std::string_view, snapshot_frame>)
      s = each(body.substr(at, klen), body.substr(at + klen, vlen), kind);
    else if (kind != snapshot_frame::entry)
      return status::invalid_argument("snapshot page: a version or sides where none are expected");
    else s = each(body.substr(at, klen), body.substr(at + klen, vlen));
    if (!s.ok()) return s;
    at += klen + vlen;
  }
  return status::ok_status();
}

}  // namespace kstate::server
