#pragma once
// Shared by the integration tests of standby copies: who owns which partition, and
// whole stores read in pages that say whether they came from a stale copy.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "agg_common.h"

namespace kstate::testing {

// The store topic partitions each instance owns, by endpoint, from /v1/cluster.
inline std::map<std::string, std::set<std::pair<std::string, int>>> owners(uint16_t port) {
  std::map<std::string, std::set<std::pair<std::string, int>>> out;
  auto c = http_client(port).get("/v1/cluster");
  if (!c || c->status != 200) return out;
  const json body = c->body_json();
  for (const auto& p : body["partitions"])
    out[p["owner"].get<std::string>()].insert({p["topic"].get<std::string>(), p["partition"].get<int>()});
  return out;
}

// Every key and value of a store read in range pages from `port` (`query` appended to
// each page's request), with the number of pages marked stale; nullopt when a page
// failed (`why`, when given, says why).
inline std::optional<std::pair<std::map<std::string, json>, int>> read_pages(uint16_t port, const std::string& store,
                                                                             const std::string& query,
                                                                             std::string* why = nullptr) {
  std::map<std::string, json> got;
  int stale_pages = 0;
  http_client c(port);
  std::string cursor;
  for (;;) {
    auto r =
        c.get("/v1/stores/" + store + "/keys?limit=100" + query + (cursor.empty() ? "" : "&cursor=" + pct(cursor)));
    if (!r || r->status != 200) {
      if (why) *why = r ? r->body : std::string("no answer");
      return std::nullopt;
    }
    const json body = r->body_json();
    if (body["metadata"].value("stale", false)) ++stale_pages;
    for (const auto& e : body["data"]) got[e["key"].get<std::string>()] = e["value"];
    if (body["metadata"]["next"].is_null()) break;
    cursor = body["metadata"]["next"].get<std::string>();
  }
  return std::make_pair(std::move(got), stale_pages);
}

}  // namespace kstate::testing
