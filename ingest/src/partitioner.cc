#include "ingest/partitioner.h"

#include <librdkafka/rdkafka.h>

namespace kstate::ingest {

std::optional<partitioner_fn> make_partitioner(std::string_view name) {
  // librdkafka's partitioner functions only hash the key for these variants; the topic
  // handle and opaques are unused, so they are passed as null.
  using fn_t = int32_t (*)(const rd_kafka_topic_t*, const void*, size_t, int32_t, void*, void*);
  fn_t fn = nullptr;
  if (name == "murmur2") fn = rd_kafka_msg_partitioner_murmur2;
  else if (name == "consistent") fn = rd_kafka_msg_partitioner_consistent;
  else if (name == "fnv1a") fn = rd_kafka_msg_partitioner_fnv1a;
  else return std::nullopt;
  return partitioner_fn([fn](std::string_view key, int32_t partition_count) -> int32_t {
    if (partition_count <= 0) return -1;
    return fn(nullptr, key.data(), key.size(), partition_count, nullptr, nullptr);
  });
}

}  // namespace kstate::ingest
