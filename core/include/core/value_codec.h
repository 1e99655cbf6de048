#pragma once
// Stored value layout: offset of the record that wrote it (8 bytes, big-endian) ++ the
// record's value bytes, unchanged. Answers report which record they come from, and
// validated JSON values are embedded in responses without re-parsing.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kstate {

std::string frame_value(int64_t offset, std::string_view value);
// The frame alone (the 8 offset bytes), for writers that store frame and value as
// separate parts: frame_value(o, v) == frame_header(o) ++ v.
std::array<char, 8> frame_header(int64_t offset);

struct framed_value {
  int64_t offset;
  std::string_view value;  // points into the framed buffer
};
std::optional<framed_value> unframe_value(std::string_view framed);

}  // namespace kstate
