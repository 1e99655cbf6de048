#include "core/value_codec.h"

#include <limits>

namespace kstate {
namespace {

constexpr uint64_t timed_bit = uint64_t{1} << 63;

void put_be(char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (56 - 8 * i));
}

uint64_t get_be(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(in[i]);
  return v;
}

}  // namespace

std::array<char, 8> frame_header(int64_t offset) {
  std::array<char, 8> out;
  put_be(out.data(), static_cast<uint64_t>(offset));
  return out;
}

std::array<char, 16> frame_header(int64_t offset, int64_t time) {
  std::array<char, 16> out;
  put_be(out.data(), static_cast<uint64_t>(offset) | timed_bit);
  put_be(out.data() + 8, static_cast<uint64_t>(time));
  return out;
}

std::string frame_value(int64_t offset, std::string_view value) {
  auto head = frame_header(offset);
  std::string out;
  out.reserve(head.size() + value.size());
  out.append(head.data(), head.size()).append(value);
  return out;
}

std::string frame_value(int64_t offset, int64_t time, std::string_view value) {
  auto head = frame_header(offset, time);
  std::string out;
  out.reserve(head.size() + value.size());
  out.append(head.data(), head.size()).append(value);
  return out;
}

std::optional<framed_value> unframe_value(std::string_view framed) {
  if (framed.size() < 8) return std::nullopt;
  const uint64_t first = get_be(framed.data());
  if (!(first & timed_bit)) return framed_value{static_cast<int64_t>(first), std::nullopt, framed.substr(8)};
  if (framed.size() < 16) return std::nullopt;
  return framed_value{static_cast<int64_t>(first & ~timed_bit), static_cast<int64_t>(get_be(framed.data() + 8)),
                      framed.substr(16)};
}

bool ttl_expired(int64_t time, int64_t ttl_ms, int64_t now) noexcept {
  int64_t until = 0;
  if (__builtin_add_overflow(time, ttl_ms, &until)) return false;  // beyond the largest time: never
  return now >= until;
}

}  // namespace kstate
