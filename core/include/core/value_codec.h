#pragma once
// Stored value layout: a frame, then the record's value bytes, unchanged. Answers report
// which record they come from, and validated JSON values are embedded in responses
// without re-parsing.
//
// Two frames exist; the top bit of the first byte tells them apart (offsets are never
// negative, so a plain frame never has it set):
//   plain (8 bytes):  offset of the record that wrote the value, big-endian.
//   timed (16 bytes): the same offset with the top bit set, then the value's time (ms
//                     since the epoch, big-endian, two's complement): when the key was
//                     last updated, as a view with a time to live counts it (its
//                     record's timestamp, or when it was applied).
// Values stored before timed frames existed read as plain ones; a view without a time to
// live writes plain frames and pays nothing for the other kind.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kstate {

// `offset` must not be negative (a Kafka offset).
std::string frame_value(int64_t offset, std::string_view value);
std::string frame_value(int64_t offset, int64_t time, std::string_view value);
// The frame alone, for writers that store frame and value as separate parts:
// frame_value(o, v) == frame_header(o) ++ v, frame_value(o, t, v) == frame_header(o, t) ++ v.
std::array<char, 8> frame_header(int64_t offset);
std::array<char, 16> frame_header(int64_t offset, int64_t time);

struct framed_value {
  int64_t offset;
  std::optional<int64_t> time;  // a timed frame's time; nullopt for a plain frame
  std::string_view value;       // points into the framed buffer
};
// nullopt when `framed` is shorter than its frame.
std::optional<framed_value> unframe_value(std::string_view framed);

// True when a value last updated at `time` has outlived `ttl_ms` at `now` (all in ms):
// it is served while now < time + ttl_ms. Saturates rather than overflows.
bool ttl_expired(int64_t time, int64_t ttl_ms, int64_t now) noexcept;

}  // namespace kstate
