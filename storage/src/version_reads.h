#pragma once
// Reads of versioned views (internal to storage; the snapshot's versioned reads call
// these). Every read goes through `snap`, so it sees the database at one instant.

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <rocksdb/db.h>

#include "core/status.h"
#include "storage/db.h"
#include "versions.h"

namespace kstate::storage {

result<std::optional<int64_t>> read_history_start(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* meta,
                                                  const rocksdb::Snapshot* snap, const versioned_state& state,
                                                  int32_t partition);
result<std::optional<version>> read_version_at(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* cf,
                                               const rocksdb::Snapshot* snap, int32_t partition, std::string_view key,
                                               int64_t time);
result<std::vector<version>> read_versions(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* cf,
                                           const rocksdb::Snapshot* snap, int32_t partition, std::string_view key,
                                           int64_t from, int64_t to, int64_t not_before, size_t limit);
std::unique_ptr<partition_cursor> make_as_of_cursor(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* cf,
                                                    const rocksdb::Snapshot* snap, int64_t time, bool descending,
                                                    scan_use use);
std::unique_ptr<partition_iterator> make_version_scan(rocksdb::DB& rdb, rocksdb::ColumnFamilyHandle* cf,
                                                      const rocksdb::Snapshot* snap, int32_t partition);

}  // namespace kstate::storage
