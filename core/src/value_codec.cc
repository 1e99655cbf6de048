#include "core/value_codec.h"

namespace kstate {

std::string frame_value(int64_t offset, std::string_view value) {
  std::string out;
  out.resize(8 + value.size());
  auto v = static_cast<uint64_t>(offset);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (56 - 8 * i));
  if (!value.empty()) out.replace(8, value.size(), value);
  return out;
}

std::optional<framed_value> unframe_value(std::string_view framed) {
  if (framed.size() < 8) return std::nullopt;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(framed[i]);
  return framed_value{static_cast<int64_t>(v), framed.substr(8)};
}

}  // namespace kstate
