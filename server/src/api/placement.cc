#include "api/placement.h"

#include <algorithm>

#include "ingest/standby.h"
#include "server/problem.h"

namespace kstate::server::api {

bool held_here(const state& st, const std::string& topic, int32_t partition) {
  auto ps = st.ctx.ownership->partition(topic, partition);
  return ps && ps->assigned;
}

std::optional<std::string> owner_of(const state& st, const std::string& topic, int32_t partition) {
  if (!st.forwarding()) return std::nullopt;
  auto owner = st.ctx.membership->current()->owner(topic, partition);
  if (!owner || !st.peer_allowed(*owner)) return std::nullopt;
  return owner;
}

std::vector<std::string> copy_holders(const state& st, const std::string& topic, int32_t partition,
                                      const std::optional<std::string>& owner) {
  std::vector<std::string> out;
  if (!st.forwarding()) return out;
  auto snap = st.ctx.membership->current();
  auto add = [&](const std::string& endpoint) {
    if (endpoint.empty() || endpoint == owner || !st.peer_allowed(endpoint)) return;
    if (std::find(out.begin(), out.end(), endpoint) == out.end()) out.push_back(endpoint);
  };
  if (owner)
    for (const auto& e : ingest::standbys_for(*snap, topic, partition, st.ctx.standby_replicas)) add(e);
  for (const auto& m : snap->members) add(m.endpoint);
  return out;
}

param<placement> place(const state& st, const call& c, const view_def& view, const std::vector<int32_t>& partitions) {
  placement out;
  std::shared_ptr<const cluster_snapshot> snap;
  for (int32_t p : partitions) {
    if (held_here(st, view.topic, p)) {
      out.local.push_back(p);
      continue;
    }
    std::optional<std::string> owner;
    if (!c.from_peer && st.forwarding()) {
      if (!snap) snap = st.ctx.membership->current();
      owner = snap->owner(view.topic, p);
      if (owner && !st.peer_allowed(*owner)) owner.reset();
    }
    if (!owner)
      return problem(failure_reason::not_owner,
                     "partition " + std::to_string(p) + " of '" + view.topic +
                         "' has no owner that can answer yet (the group is rebalancing or restoring)",
                     c.path());
    out.remote[*owner].push_back(p);
  }
  return out;
}

position bound_for(const call& c, const std::vector<int32_t>& partitions) {
  if (!c.min_position) return {};
  return c.min_position->filtered([&](int32_t p) {
    for (int32_t q : partitions)
      if (q == p) return true;
    return false;
  });
}

std::string wait_params(const call& c, const std::vector<int32_t>& partitions, std::chrono::milliseconds& wait) {
  wait = std::chrono::milliseconds(0);
  auto bound = bound_for(c, partitions);
  if (bound.empty()) return {};
  wait = std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(c.wait_deadline - clock_type::now()));
  std::string list;
  for (const auto& [p, o] : bound) list += (list.empty() ? "" : ",") + std::to_string(p) + ":" + std::to_string(o);
  return "&min_position=" + list + "&timeout_ms=" + std::to_string(wait.count());
}

param<std::vector<int32_t>> all_partitions(const state& st, const call& c, const view_def& view) {
  int32_t count = st.ctx.ownership->partition_count(view.topic);
  if (count <= 0)
    return problem(failure_reason::not_caught_up, "partition count of '" + view.topic + "' not known yet", c.path());
  std::vector<int32_t> out(static_cast<std::size_t>(count));
  for (int32_t p = 0; p < count; ++p) out[static_cast<std::size_t>(p)] = p;
  return out;
}

}  // namespace kstate::server::api
