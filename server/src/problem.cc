#include "server/problem.h"

#include <algorithm>
#include <string>

namespace kstate::server {
namespace {

struct row {
  failure_reason reason;
  std::string_view name;  // snake_case; the problem "type" is "/problems/<name>"
  failure_info info;
};

// The one table. error_code is status * 100 + subcode; subcodes are stable once
// published, so new reasons get the next free subcode for their status, never reuse.
constexpr row table[] = {
    {failure_reason::unknown_store, "unknown_store", {404, 40401, "Unknown store"}},
    {failure_reason::key_not_found, "key_not_found", {404, 40402, "Key not found"}},
    {failure_reason::route_not_found, "route_not_found", {404, 40403, "Route not found"}},
    {failure_reason::bad_request, "bad_request", {400, 40001, "Bad request"}},
    {failure_reason::bad_key_encoding, "bad_key_encoding", {400, 40002, "Bad key encoding"}},
    {failure_reason::bad_path_encoding, "bad_path_encoding", {400, 40003, "Bad path encoding"}},
    {failure_reason::bad_cursor, "bad_cursor", {400, 40004, "Bad cursor"}},
    {failure_reason::bad_limit, "bad_limit", {400, 40005, "Bad limit"}},
    {failure_reason::bad_position, "bad_position", {400, 40006, "Bad position"}},
    {failure_reason::unknown_parameter, "unknown_parameter", {400, 40007, "Unknown parameter"}},
    {failure_reason::bad_body, "bad_body", {400, 40008, "Bad request body"}},
    {failure_reason::answer_too_large, "answer_too_large", {400, 40009, "Answer too large"}},
    {failure_reason::method_not_allowed, "method_not_allowed", {405, 40501, "Method not allowed"}},
    {failure_reason::not_acceptable, "not_acceptable", {406, 40601, "Not acceptable"}},
    {failure_reason::payload_too_large, "payload_too_large", {413, 41301, "Payload too large"}},
    {failure_reason::uri_too_long, "uri_too_long", {414, 41401, "URI too long"}},
    {failure_reason::unsupported_media, "unsupported_media", {415, 41501, "Unsupported media type"}},
    {failure_reason::headers_too_large, "headers_too_large", {431, 43101, "Request header fields too large"}},
    {failure_reason::internal, "internal", {500, 50001, "Internal server error"}},
    {failure_reason::not_caught_up, "not_caught_up", {503, 50301, "Partition not caught up"}},
    {failure_reason::not_owner, "not_owner", {503, 50302, "Partition not owned by this instance"}},
    {failure_reason::shutting_down, "shutting_down", {503, 50303, "Server shutting down"}},
    {failure_reason::position_not_reached, "position_not_reached", {503, 50304, "Position not reached"}},
    {failure_reason::scan_capacity, "scan_capacity", {503, 50305, "Too many scans"}},
    {failure_reason::too_many_connections, "too_many_connections", {503, 50306, "Too many connections"}},
    {failure_reason::too_many_waits, "too_many_waits", {503, 50307, "Too many waiting requests"}},
    {failure_reason::busy, "busy", {503, 50308, "Server busy"}},
    {failure_reason::unauthenticated, "unauthenticated", {401, 40101, "Unauthenticated"}},
    {failure_reason::forbidden, "forbidden", {403, 40301, "Forbidden"}},
    {failure_reason::bad_peer, "bad_peer", {401, 40102, "Peer authentication failed"}},
    {failure_reason::history_gone, "history_gone", {410, 41001, "Change history gone"}},
    {failure_reason::subscription_capacity, "subscription_capacity", {503, 50309, "Too many subscriptions"}},
    {failure_reason::version_history_gone, "version_history_gone", {410, 41002, "Version history gone"}},
};

constexpr std::size_t internal_row = 18;
static_assert(table[internal_row].reason == failure_reason::internal);

const row& lookup(failure_reason r) noexcept {
  for (const row& x : table) {
    if (x.reason == r) return x;
  }
  // Only reachable with a value cast from outside the enum; answer as a bug.
  return table[internal_row];
}

}  // namespace

failure_info describe(failure_reason r) noexcept { return lookup(r).info; }

std::string_view name_of(failure_reason r) noexcept { return lookup(r).name; }

http::response problem(failure_reason r, std::string_view detail, std::string_view instance, int retry_after_s) {
  const row& x = lookup(r);
  return http::problem(x.info.status, "/problems/" + std::string(x.name), x.info.title, detail, instance,
                       {{"error_code", x.info.error_code}}, retry_after_s);
}

http::response render_server_error(http::server_error e, std::string_view detail, std::string_view instance) {
  switch (e) {
    case http::server_error::bad_request: return problem(failure_reason::bad_request, detail, instance);
    case http::server_error::bad_target: return problem(failure_reason::bad_path_encoding, detail, instance);
    case http::server_error::payload_too_large: return problem(failure_reason::payload_too_large, detail, instance);
    case http::server_error::uri_too_long: return problem(failure_reason::uri_too_long, detail, instance);
    case http::server_error::headers_too_large: return problem(failure_reason::headers_too_large, detail, instance);
    case http::server_error::internal: return problem(failure_reason::internal, detail, instance);
    case http::server_error::overloaded: return problem(failure_reason::too_many_connections, detail, instance);
  }
  return problem(failure_reason::internal, detail, instance);
}

}  // namespace kstate::server
