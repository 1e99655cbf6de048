#include "snapshots.h"

#include <xxhash.h>

#include <random>

namespace kstate::server {

void append_snapshot_frame(std::string& out, std::string_view key, std::string_view value, snapshot_frame kind) {
  auto put = [&out](uint32_t v) {
    out.push_back(static_cast<char>(v >> 24));
    out.push_back(static_cast<char>(v >> 16));
    out.push_back(static_cast<char>(v >> 8));
    out.push_back(static_cast<char>(v));
  };
  const uint32_t flag = kind == snapshot_frame::version ? snapshot_version_flag
                        : kind == snapshot_frame::side  ? snapshot_side_flag
                                                        : 0;
  put(static_cast<uint32_t>(key.size()) | flag);
  put(static_cast<uint32_t>(value.size()));
  out.append(key);
  out.append(value);
}

struct snapshot_sender::session {
  std::mutex mu;  // one page at a time
  // The iterator reads through the snapshot: declared after it, destroyed before it.
  std::shared_ptr<const storage::snapshot> snap;
  std::unique_ptr<storage::partition_iterator> it;
  XXH64_state_t* hash = XXH64_createState();
  uint64_t next_page = 0;
  uint64_t total = 0;
  snapshot_page previous;  // the page last returned, for a retry
  bool ended = false;      // the last page was made
  storage::view_id view = 0;
  int32_t partition = 0;
  // What `it` reads: the view's entries, then its stored versions (versioned views; none
  // for others), then a join view's sides.
  snapshot_frame phase = snapshot_frame::entry;
  std::optional<storage::view_id> sides;  // a join view's sides
  uint64_t total_sides = 0;
  std::chrono::steady_clock::time_point used;  // guarded by snapshot_sender::mu_

  session() { XXH64_reset(hash, 0); }
  ~session() {
    it.reset();
    XXH64_freeState(hash);
  }
};

snapshot_sender::snapshot_sender(const storage::db& db, snapshot_sender_limits limits,
                                 const std::vector<view_def>& views)
    : db_(db), limits_(limits) {
  for (const auto& v : views)
    if (v.is_join())
      if (auto id = db_.find_view(join_sides_name(v))) sides_.emplace(v.name, *id);
}
snapshot_sender::~snapshot_sender() = default;

bool snapshot_sender::carries_sides(std::string_view view) const { return sides_.find(view) != sides_.end(); }

result<view_positions> snapshot_sender::positions(std::string_view view, int32_t partition) const {
  auto id = db_.find_view(view);
  if (!id) return status::not_found("no store '" + std::string(view) + "'");
  return db_.read_snapshot()->view_positions(*id, partition);
}

void snapshot_sender::drop_idle(std::chrono::steady_clock::time_point now) {
  for (auto it = sessions_.begin(); it != sessions_.end();)
    if (now - it->second->used > limits_.idle) it = sessions_.erase(it);
    else ++it;
}

result<snapshot_sender::offer> snapshot_sender::open(std::string_view view, int32_t partition) {
  auto id = db_.find_view(view);
  if (!id) return status::not_found("no store '" + std::string(view) + "'");
  auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    drop_idle(now);
    if (sessions_.size() >= limits_.max_sessions) {
      // Sessions whose last page went out are only kept for a retry of it: room first.
      for (auto it = sessions_.begin(); it != sessions_.end() && sessions_.size() >= limits_.max_sessions;)
        if (it->second->ended) it = sessions_.erase(it);
        else ++it;
      if (sessions_.size() >= limits_.max_sessions)
        return status::resource_exhausted(std::to_string(sessions_.size()) + " copies are being sent already");
    }
  }
  auto s = std::make_shared<session>();
  s->snap = db_.read_snapshot();
  auto positions = s->snap->view_positions(*id, partition);
  if (!positions.ok()) return positions.error();
  if (positions->empty())
    return status::not_found("no state of store '" + std::string(view) + "' partition " + std::to_string(partition) +
                             " here");
  s->it = s->snap->scan(*id, partition, std::nullopt, std::nullopt, false, storage::scan_use::sweep);
  s->view = *id;
  s->partition = partition;
  if (auto j = sides_.find(view); j != sides_.end()) s->sides = j->second;
  s->used = now;
  std::random_device rd;
  char id_hex[33];
  std::snprintf(id_hex, sizeof id_hex, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  offer o{id_hex, std::move(*positions)};
  std::lock_guard lock(mu_);
  sessions_.emplace(o.session, std::move(s));
  return o;
}

result<snapshot_page> snapshot_sender::read(const std::string& id, uint64_t n) {
  std::shared_ptr<session> s;
  {
    std::lock_guard lock(mu_);
    drop_idle(std::chrono::steady_clock::now());
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return status::not_found("no snapshot session '" + id.substr(0, 64) + "'");
    s = it->second;
    s->used = std::chrono::steady_clock::now();
  }
  std::lock_guard lock(s->mu);
  if (s->next_page > 0 && n + 1 == s->next_page) return s->previous;
  if (n != s->next_page || s->ended)
    return status::invalid_argument("page " + std::to_string(n) + " asked, page " + std::to_string(s->next_page) +
                                    " is next");
  snapshot_page p;
  for (;;) {
    if (!s->it->valid()) {
      if (auto e = s->it->error(); !e.ok()) return e;
      if (s->phase == snapshot_frame::entry) {
        // Then the partition's stored versions (an empty scan unless the view is versioned).
        s->it = s->snap->scan_versions(s->view, s->partition);
        s->phase = snapshot_frame::version;
        continue;
      }
      if (s->phase == snapshot_frame::version && s->sides) {
        // Then a join view's sides, from the same snapshot as its joined values.
        s->it = s->snap->scan(*s->sides, s->partition, std::nullopt, std::nullopt, false, storage::scan_use::sweep);
        s->phase = snapshot_frame::side;
        continue;
      }
      break;
    }
    if (!p.body.empty() && p.body.size() >= limits_.page_bytes) break;
    append_snapshot_frame(p.body, s->it->key(), s->it->value(), s->phase);
    ++p.entries;
    if (s->phase == snapshot_frame::side) ++s->total_sides;
    s->it->next();
  }
  if (auto e = s->it->error(); !e.ok()) return e;
  XXH64_update(s->hash, p.body.data(), p.body.size());
  s->total += p.entries;
  const snapshot_frame final_phase = s->sides ? snapshot_frame::side : snapshot_frame::version;
  p.last = s->phase == final_phase && !s->it->valid();
  if (p.last) {
    p.total_entries = s->total;
    p.digest = XXH64_digest(s->hash);
    if (s->sides) p.total_sides = s->total_sides;
    s->ended = true;
  }
  ++s->next_page;
  s->previous = p;
  return p;
}

size_t snapshot_sender::open_sessions() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

}  // namespace kstate::server
