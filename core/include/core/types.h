#pragma once
// Strong types for the numbers that are easy to mix up, and the position vocabulary
// shared by ingest (which advances positions) and query (which reports them).

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace kstate {

// named_type: a number that does not silently convert into another named_type.
template <typename T, typename Tag>
class named_type {
 public:
  using value_type = T;
  constexpr named_type() = default;
  constexpr explicit named_type(T v) : v_(v) {}
  constexpr T value() const noexcept { return v_; }
  constexpr auto operator<=>(const named_type&) const = default;

 private:
  T v_{};
};

using partition_id = named_type<int32_t, struct partition_id_tag>;
// A Kafka offset. Positions are always "next offset to apply": the offset of the
// last applied record plus one.
using kafka_offset = named_type<int64_t, struct kafka_offset_tag>;

// position: per source partition of one topic, the next offset the state reflects.
// Ordered by partition, so it renders deterministically.
using position = std::map<int32_t, int64_t>;

// Maps a serialized key to its partition, as the producers' partitioner does.
// Implemented in ingest (librdkafka's partitioners), used by query; wired by server.
using partitioner_fn = std::function<int32_t(std::string_view key, int32_t partition_count)>;

}  // namespace kstate

template <typename T, typename Tag>
struct std::hash<kstate::named_type<T, Tag>> {
  size_t operator()(const kstate::named_type<T, Tag>& v) const noexcept { return std::hash<T>{}(v.value()); }
};
