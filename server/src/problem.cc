#include "server/problem.h"

#include <nlohmann/json.hpp>

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
    {failure_reason::unauthenticated, "unauthenticated", {401, 40101, "Unauthenticated"}},
    {failure_reason::forbidden, "forbidden", {403, 40301, "Forbidden"}},
};

constexpr std::size_t internal_row = 17;
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

http_response problem(failure_reason r, std::string_view detail, std::string_view instance,
                      int retry_after_s) {
  const row& x = lookup(r);
  nlohmann::json body = {
      {"type", "/problems/" + std::string(x.name)},
      {"title", x.info.title},
      {"status", x.info.status},
      {"detail", detail},
      {"error_code", x.info.error_code},
  };
  if (!instance.empty()) body["instance"] = instance;

  http_response res;
  res.status = x.info.status;
  res.content_type = "application/problem+json";
  // detail and instance can carry decoded request bytes (a binary key, a bad path) that
  // are not UTF-8; dump() would throw on them, so invalid sequences become U+FFFD.
  res.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (x.info.status == 503) {
    res.with_header("Retry-After", std::to_string(std::max(retry_after_s, 0)));
  }
  return res;
}

failure_reason reason_for(const status& s) noexcept {
  switch (s.code()) {
    case status_code::unavailable:
      return failure_reason::not_caught_up;
    case status_code::invalid_argument:
      return failure_reason::bad_request;
    case status_code::not_found:
      return failure_reason::unknown_store;
    default:
      return failure_reason::internal;
  }
}

}  // namespace kstate::server
