#pragma once
// The snapshot that begins a table view's change subscription with snapshot=true: the
// current entries of the selection, read through the API as a client reads them
// (pages of the key range, or one batch of keys), so every owner answers for its own
// partitions and the subscription works on any instance. Internal to the server.
//
// Each page reflects its partitions at its own position, and a later page may be
// fresher than an earlier one. So the changes that follow start, per partition, at the
// oldest position any page read, and a change is left out when the page that covers
// its key already reflected it (its offset is before that page's position of the
// key's partition). Every change of the selection then reaches the subscriber exactly
// once, either inside the snapshot or after it.
//
// Thread safety: none; the subscription's thread uses it.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/types.h"
#include "http/message.h"
#include "ingest/change_feed.h"

namespace kstate::server::api {

class table_snapshot {
 public:
  // `store` is read through `self` (the API's own handler) with the caller's
  // `authorization` header (empty: none), `page_limit` entries per page.
  table_snapshot(http::async_handler self, std::string store, ingest::feed_selection sel, std::string authorization,
                 uint32_t page_limit);

  // Reads the next page and appends its entries (JSON objects, as the page rendered
  // them) to `out`. false once every page was read. unavailable when the API cannot
  // answer (an owner down for longer than the retries, the API stopping).
  result<bool> next(std::vector<std::string>& out);

  // Once next() returned false: per partition, where the changes after the snapshot
  // begin.
  std::map<int32_t, int64_t> follow_from() const;
  // True when the snapshot already reflects the change at `offset` of `partition` to
  // `key` (serialized bytes): it must not be delivered again.
  bool reflected(int32_t partition, int64_t offset, std::string_view key) const;

 private:
  // One page read: the last key it covers (nullopt: the end of the range) and the
  // position it reflects.
  struct page {
    std::optional<std::string> last_key;
    position pos;
  };
  http::response ask(const std::string& method, const std::string& target, std::string body) const;

  http::async_handler self_;
  std::string store_;
  ingest::feed_selection sel_;
  std::string authorization_;
  uint32_t page_limit_;
  std::optional<std::string> cursor_;
  bool done_ = false;
  std::vector<page> pages_;
};

}  // namespace kstate::server::api
