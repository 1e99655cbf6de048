#pragma once
// view_def: a view as configured, the vocabulary shared by ingest (which materializes
// it) and query (which answers from it).

#include <string>
#include <string_view>

namespace kstate {

enum class data_format { string, json, bytes };
enum class view_kind { table };

const char* to_string(data_format f) noexcept;
const char* to_string(view_kind k) noexcept;
bool parse_data_format(std::string_view s, data_format& out) noexcept;

struct view_def {
  // Store name, used in URLs (/v1/stores/{name}) and as the RocksDB column family.
  std::string name;
  view_kind kind = view_kind::table;
  // Source topic.
  std::string topic;
  // How record keys are validated and rendered. Default string (UTF-8).
  data_format key_format = data_format::string;
  // How record values are validated and rendered. Default json.
  data_format value_format = data_format::json;
  // Producers' partitioner used to route keys: murmur2 (Java client default),
  // consistent (librdkafka default, crc32), fnv1a.
  std::string partitioner = "murmur2";
  // Topic receiving records this view rejects; empty: none (rejections are only
  // counted and logged).
  std::string dead_letter_topic;
};

}  // namespace kstate
