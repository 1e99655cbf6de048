#pragma once
// Stored value layout: offset of the record that wrote it (8 bytes, big-endian) ++ the
// record's value bytes, unchanged. Answers report which record they come from, and
// validated JSON values are embedded in responses without re-parsing.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kstate {

std::string frame_value(int64_t offset, std::string_view value);

struct framed_value {
  int64_t offset;
  std::string_view value;  // points into the framed buffer
};
std::optional<framed_value> unframe_value(std::string_view framed);

}  // namespace kstate
