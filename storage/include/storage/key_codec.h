#pragma once
// Byte layout of keys inside a view's column family.
//
// data key     = partition (4 bytes, big-endian) ++ serialized record key
//
// The partition prefix keeps each partition's keys contiguous, so a partition can be
// iterated (or dropped) on its own, and within a partition keys sort by their
// serialized bytes, which is the order ranges are answered in.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kstate::storage {

std::string encode_data_key(int32_t partition, std::string_view key);
// The same bytes appended to `out` (several keys in one buffer).
void append_data_key(std::string& out, int32_t partition, std::string_view key);

struct decoded_key {
  int32_t partition;
  std::string_view key;  // points into the encoded buffer
};
// nullopt when the buffer is shorter than the prefix.
std::optional<decoded_key> decode_data_key(std::string_view encoded);

// Position records live in the meta column family:
//   "pos" 0x00 ++ view name ++ 0x00 ++ partition (4 bytes BE)  ->  next offset (8 bytes BE)
std::string encode_position_key(std::string_view view, int32_t partition);
std::string encode_offset(int64_t next_offset);
std::optional<int64_t> decode_offset(std::string_view bytes);

}  // namespace kstate::storage
