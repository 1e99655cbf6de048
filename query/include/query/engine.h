#pragma once
// query::engine: answers queries over the local stores, in the vocabulary of Kafka
// Streams' Interactive Queries v2 (key_query, query_result, failure_reason, position).
// It knows nothing of HTTP; server/ translates requests to these calls.
//
// Thread safety: every member is safe to call concurrently from the HTTP threads.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ownership.h"
#include "core/types.h"
#include "core/view.h"
#include "storage/db.h"

namespace kstate::query {

enum class failure_reason {
  unknown_query_store,  // no store of that name
  not_active,           // the key's partition is not assigned to this instance
  not_up_to_date,       // assigned here but still catching up (restoring)
  store_exception,      // storage failed
};

const char* to_string(failure_reason r) noexcept;

struct key_query {
  std::string store;
  std::string key;  // serialized key bytes, exactly as producers wrote them
};

struct key_answer {
  std::optional<std::string> value;  // nullopt: absent; else the record's value bytes
  int64_t offset = -1;               // offset of the record that wrote the value
  int32_t partition = -1;
  position pos;                      // the key's partition -> next offset reflected
};

template <typename T>
struct query_result {
  std::optional<T> answer;
  std::optional<failure_reason> failure;
  std::string message;  // why it failed

  bool ok() const { return answer.has_value(); }
  static query_result success(T a) { return {std::move(a), std::nullopt, {}}; }
  static query_result fail(failure_reason r, std::string m) { return {std::nullopt, r, std::move(m)}; }
};

struct partition_info {
  int32_t partition;
  bool assigned;
  bool ready;
  std::optional<int64_t> position;  // stored next offset, if any
  int64_t catch_up_target;          // -1: unknown
};

struct store_info {
  const view_def* def;
  int32_t partition_count;  // 0 until known
  std::vector<partition_info> partitions;  // partitions assigned here
  storage::view_stats stats;
};

class engine {
 public:
  // `partitioners` maps each store name to its key -> partition function.
  engine(const std::vector<view_def>& views, storage::db& db, const ownership_registry& ownership,
         std::map<std::string, partitioner_fn> partitioners);

  const std::vector<view_def>& views() const { return views_; }
  const view_def* find_store(std::string_view name) const;

  // Latest value of a key. Fails with not_active / not_up_to_date rather than answer
  // "absent" for a partition this instance does not hold current.
  query_result<key_answer> get(const key_query& q) const;

  // Metadata of a store: partitions, positions, size estimates.
  query_result<store_info> describe(std::string_view store) const;

 private:
  std::vector<view_def> views_;
  storage::db& db_;
  const ownership_registry& ownership_;
  std::map<std::string, partitioner_fn, std::less<>> partitioners_;
};

}  // namespace kstate::query
