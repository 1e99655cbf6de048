#include "storage/key_codec.h"

namespace kstate::storage {
namespace {

void put_u32_be(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v >> 24));
  out.push_back(static_cast<char>(v >> 16));
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

uint32_t get_u32_be(std::string_view in) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(in[i])); };
  return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

}  // namespace

std::string encode_data_key(int32_t partition, std::string_view key) {
  std::string out;
  out.reserve(4 + key.size());
  append_data_key(out, partition, key);
  return out;
}

void append_data_key(std::string& out, int32_t partition, std::string_view key) {
  put_u32_be(out, static_cast<uint32_t>(partition));
  out.append(key);
}

std::optional<decoded_key> decode_data_key(std::string_view encoded) {
  if (encoded.size() < 4) return std::nullopt;
  return decoded_key{static_cast<int32_t>(get_u32_be(encoded)), encoded.substr(4)};
}

std::string encode_position_key(std::string_view view, int32_t partition) {
  std::string out("pos");
  out.push_back('\0');
  out.append(view);
  out.push_back('\0');
  put_u32_be(out, static_cast<uint32_t>(partition));
  return out;
}

std::string encode_offset(int64_t next_offset) {
  std::string out;
  auto v = static_cast<uint64_t>(next_offset);
  put_u32_be(out, static_cast<uint32_t>(v >> 32));
  put_u32_be(out, static_cast<uint32_t>(v));
  return out;
}

std::optional<int64_t> decode_offset(std::string_view bytes) {
  if (bytes.size() != 8) return std::nullopt;
  uint64_t hi = get_u32_be(bytes.substr(0, 4));
  uint64_t lo = get_u32_be(bytes.substr(4, 4));
  return static_cast<int64_t>((hi << 32) | lo);
}

}  // namespace kstate::storage
