// The internal routes a copy of one partition travels by (snapshots.h): asked only by
// other instances of the group, with a signed request (DESIGN.md invariant 10).

#include <nlohmann/json.hpp>

#include <charconv>

#include "api/handlers.h"
#include "server/problem.h"
#include "snapshots.h"

namespace kstate::server::api {
namespace {

std::optional<int32_t> partition_of(const std::string& s) {
  int32_t p = -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), p);
  if (ec != std::errc() || end != s.data() + s.size() || p < 0) return std::nullopt;
  return p;
}

nlohmann::json positions_json(const view_positions& positions) {
  auto out = nlohmann::json::array();
  for (const auto& [name, offset] : positions) out.push_back({{"name", name}, {"offset", offset}});
  return out;
}

http::response json_answer(const nlohmann::json& j) {
  http::response r;
  r.body = j.dump();
  return r;
}

http::response failed(const status& s, const call& c) {
  switch (s.code()) {
    case status_code::not_found: return problem(failure_reason::key_not_found, s.message(), c.path());
    case status_code::resource_exhausted: return problem(failure_reason::busy, s.message(), c.path(), 5);
    case status_code::invalid_argument: return problem(failure_reason::bad_request, s.message(), c.path());
    default: return problem(failure_reason::internal, s.message(), c.path());
  }
}

}  // namespace

outcome snapshot_get(const state& st, const call& c) {
  auto p = partition_of(c.key);
  if (!p) return problem(failure_reason::bad_request, "the partition must be a number", c.path());
  if (!st.ctx.snapshots) return problem(failure_reason::key_not_found, "this instance sends no copies", c.path());
  auto session = c.r().param("session");
  auto page = c.r().param("page");
  uint64_t n = 0;
  if (session) {
    if (!page || std::from_chars(page->data(), page->data() + page->size(), n).ec != std::errc())
      return problem(failure_reason::bad_request, "page must be a number", c.path());
  }
  auto sender = st.ctx.snapshots;
  std::string store = c.store;
  std::string id = session ? std::string(*session) : std::string();
  return local_plan{{}, false, [sender, store, id, n, part = *p, c]() -> http::response {
                      if (id.empty()) {
                        // The probe: which positions a copy taken now would reflect.
                        auto positions = sender->positions(store, part);
                        if (!positions.ok()) return failed(positions.error(), c);
                        nlohmann::json j{{"positions", positions_json(*positions)}};
                        // Receivers copy a join view only from a sender whose copies carry its sides.
                        if (sender->carries_sides(store)) j["sides"] = true;
                        return json_answer(j);
                      }
                      auto got = sender->read(id, n);
                      if (!got.ok()) return failed(got.error(), c);
                      http::response r;
                      r.content_type = "application/vnd.kstate.snapshot";
                      r.body = std::move(got->body);
                      r.headers.emplace_back("X-Kstate-Snapshot-Entries", std::to_string(got->entries));
                      if (got->last) {
                        r.headers.emplace_back("X-Kstate-Snapshot-Last", "1");
                        r.headers.emplace_back("X-Kstate-Snapshot-Total", std::to_string(got->total_entries));
                        char hex[17];
                        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(got->digest));
                        r.headers.emplace_back("X-Kstate-Snapshot-Digest", hex);
                        if (got->total_sides)
                          r.headers.emplace_back("X-Kstate-Snapshot-Sides", std::to_string(*got->total_sides));
                      }
                      return r;
                    }};
}

outcome snapshot_open(const state& st, const call& c) {
  auto p = partition_of(c.key);
  if (!p) return problem(failure_reason::bad_request, "the partition must be a number", c.path());
  if (!st.ctx.snapshots) return problem(failure_reason::key_not_found, "this instance sends no copies", c.path());
  auto sender = st.ctx.snapshots;
  return local_plan{{}, false, [sender, store = c.store, part = *p, c]() -> http::response {
                      auto o = sender->open(store, part);
                      if (!o.ok()) return failed(o.error(), c);
                      nlohmann::json j{{"session", o->session}, {"positions", positions_json(o->positions)}};
                      if (sender->carries_sides(store)) j["sides"] = true;
                      return json_answer(j);
                    }};
}

}  // namespace kstate::server::api
