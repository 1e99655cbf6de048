#pragma once
// Where the partitions an answer needs are: held here (assigned to this instance), or
// owned by another instance as the consumer group says. And what a request to one of
// those owners carries of the caller's min_position.

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/params.h"
#include "api/state.h"

namespace kstate::server::api {

// True when `partition` of `topic` is assigned to this instance (caught up or not).
bool held_here(const state& st, const std::string& topic, int32_t partition);
// The endpoint of the one instance that owns `partition`, when requests may be sent to
// it (forwarding on, not this instance, same scheme).
std::optional<std::string> owner_of(const state& st, const std::string& topic, int32_t partition);

// The instances other than this one and `owner` that may keep a copy of `partition`
// (for allow_stale reads): its standbys, then every other member (a former owner keeps
// what it held), each once.
std::vector<std::string> copy_holders(const state& st, const std::string& topic, int32_t partition,
                                      const std::optional<std::string>& owner);

struct placement {
  std::vector<int32_t> local;                          // held here
  std::map<std::string, std::vector<int32_t>> remote;  // other owners' partitions, by endpoint
};
// Places `partitions` of `view`'s topic. A partition neither held here nor owned by a
// reachable instance (a rebalance under way, forwarding off, a peer's request for a
// partition this instance does not hold) is 503 not_owner.
param<placement> place(const state& st, const call& c, const view_def& view, const std::vector<int32_t>& partitions);

// The part of the caller's min_position about `partitions`.
position bound_for(const call& c, const std::vector<int32_t>& partitions);
// "&min_position=...&timeout_ms=..." for a request to an owner of `partitions`, with
// the time the caller has left, or "" when there is nothing to wait for. `wait`
// receives that time.
std::string wait_params(const call& c, const std::vector<int32_t>& partitions, std::chrono::milliseconds& wait);

// Every partition of the view's topic, or 503 when the count is not known yet.
param<std::vector<int32_t>> all_partitions(const state& st, const call& c, const view_def& view);

}  // namespace kstate::server::api
