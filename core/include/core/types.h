#pragma once
// The position vocabulary shared by ingest (which advances positions) and query (which
// reports them), and the partitioner signature.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace kstate {

// position: per source partition of one topic, the next offset the state reflects:
// every record of the partition before that offset is reflected, none after it.
// Ordered by partition, so it renders deterministically.
class position {
 public:
  using map_type = std::map<int32_t, int64_t>;
  using const_iterator = map_type::const_iterator;

  position() = default;
  position(std::initializer_list<map_type::value_type> offsets) : offsets_(offsets) {}

  // The next offset of `partition`, or nullopt when this position does not cover it.
  std::optional<int64_t> at(int32_t partition) const {
    auto it = offsets_.find(partition);
    return it == offsets_.end() ? std::nullopt : std::optional<int64_t>(it->second);
  }
  bool covers(int32_t partition) const { return offsets_.count(partition) > 0; }
  void set(int32_t partition, int64_t next) { offsets_[partition] = next; }
  // Adds every partition of `other`; where both cover one, the later state wins (the
  // larger offset).
  void merge(const position& other) {
    for (const auto& [p, o] : other.offsets_) {
      auto [it, added] = offsets_.emplace(p, o);
      if (!added && it->second < o) it->second = o;
    }
  }
  // True when, for every (partition, offset) of `bound`, the record at that offset is
  // reflected here (this position's next offset is beyond it). An empty bound is
  // always reached.
  bool reached(const position& bound) const {
    for (const auto& [p, o] : bound.offsets_) {
      auto it = offsets_.find(p);
      if (it == offsets_.end() || it->second <= o) return false;
    }
    return true;
  }
  // The partitions of this position that `keep` returns true for.
  template <typename Pred>
  position filtered(Pred keep) const {
    position out;
    for (const auto& [p, o] : offsets_)
      if (keep(p)) out.offsets_.emplace_hint(out.offsets_.end(), p, o);
    return out;
  }

  bool empty() const noexcept { return offsets_.empty(); }
  std::size_t size() const noexcept { return offsets_.size(); }
  const_iterator begin() const noexcept { return offsets_.begin(); }
  const_iterator end() const noexcept { return offsets_.end(); }
  bool operator==(const position&) const = default;

 private:
  map_type offsets_;
};

// Maps a serialized key to its partition, as the producers' partitioner does.
// Implemented in ingest (librdkafka's partitioners), used by query; wired by server.
using partitioner_fn = std::function<int32_t(std::string_view key, int32_t partition_count)>;

}  // namespace kstate
