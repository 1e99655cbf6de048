#pragma once
// The per-view logic of join views, without Kafka or RocksDB: how a record of either
// input is marked with its side in the view's repartition topic, how a key's two sides
// are kept, and the joined value they make (docs/configuration.md#join-views).
//
// Thread safety: joiner is immutable after construction; share it freely.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/view.h"

namespace kstate::ingest {

enum class join_side : uint8_t { left, right };

// A repartition record of a join view: one marker byte naming the side, then the input
// record's value; the marker alone stands for a tombstone (a null value) of that side.
// Neither marker can begin a JSON text.
inline constexpr char join_left_marker = '\x02';
inline constexpr char join_right_marker = '\x03';

std::string encode_join_input(join_side side, std::optional<std::string_view> value);

struct join_input {
  join_side side;
  std::optional<std::string_view> value;  // points into the decoded buffer; nullopt: tombstone
};
// nullopt when `value` is not a join input (null, empty, or an unknown marker).
std::optional<join_input> decode_join_input(std::optional<std::string_view> value);

// The latest value of each side of one key (JSON texts); a side without one is nullopt.
struct join_sides {
  std::optional<std::string> left;
  std::optional<std::string> right;
  bool empty() const noexcept { return !left && !right; }
  std::optional<std::string>& of(join_side s) noexcept { return s == join_side::left ? left : right; }
  bool operator==(const join_sides&) const = default;
};

// The stored and changelogged form of a key's sides: a flags byte (bit 0: left
// present, bit 1: right present), the left value's length (4 bytes, big-endian), the
// left value, the right value. Empty sides encode to the empty string: the key is
// deleted (a changelog tombstone).
std::string encode_sides(const join_sides& s);
// nullopt when `bytes` is not an encoding of sides.
std::optional<join_sides> decode_sides(std::string_view bytes);

class joiner {
 public:
  // `view` is a join view (view.join set). Side values are parsed (for `select`) within
  // `max_json_depth`.
  joiner(const view_def& view, int max_json_depth);

  // The joined value of a key with these sides, JSON text; nullopt when the join type
  // holds no row for it (inner: a side missing; left: the left side missing; outer:
  // both missing).
  std::optional<std::string> joined(const join_sides& s) const;

 private:
  join_spec spec_;
  int max_json_depth_;
  // Without select: `{"<left_name>":` and `,"<right_name>":`, names JSON-escaped.
  std::string left_head_;
  std::string right_head_;
  // With select: each field's `"<as>":`, in order.
  std::vector<std::string> field_heads_;
};

}  // namespace kstate::ingest
