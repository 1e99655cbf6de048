#pragma once
// Key -> partition with the producers' partitioners, computed by librdkafka's own
// partitioner functions (never a hand-written hash).

#include <optional>
#include <string_view>

#include "core/types.h"

namespace kstate::ingest {

// murmur2: the Java client's default (librdkafka's rd_kafka_msg_partitioner_murmur2);
// consistent: librdkafka's default (crc32); fnv1a. nullopt for an unknown name.
std::optional<partitioner_fn> make_partitioner(std::string_view name);

}  // namespace kstate::ingest
