#include "core/value_codec.h"

namespace kstate {

std::array<char, 8> frame_header(int64_t offset) {
  std::array<char, 8> out;
  auto v = static_cast<uint64_t>(offset);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (56 - 8 * i));
  return out;
}

std::string frame_value(int64_t offset, std::string_view value) {
  auto head = frame_header(offset);
  std::string out;
  out.reserve(8 + value.size());
  out.append(head.data(), head.size()).append(value);
  return out;
}

std::optional<framed_value> unframe_value(std::string_view framed) {
  if (framed.size() < 8) return std::nullopt;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(framed[i]);
  return framed_value{static_cast<int64_t>(v), framed.substr(8)};
}

}  // namespace kstate
