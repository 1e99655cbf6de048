#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <iterator>
#include <string>

#include "server/problem.h"

using namespace kstate::server;

// ---------------------------------------------------------------------------------
// The failure-reason table: the data-table test of kstate's error scheme.

TEST_CASE("problem: every failure_reason maps to its status, error_code and body") {
  struct expected {
    failure_reason reason;
    const char* name;
    unsigned status;
    int subcode;
  };
  const expected rows[] = {
      {failure_reason::unknown_store, "unknown_store", 404, 1},
      {failure_reason::key_not_found, "key_not_found", 404, 2},
      {failure_reason::route_not_found, "route_not_found", 404, 3},
      {failure_reason::bad_request, "bad_request", 400, 1},
      {failure_reason::bad_key_encoding, "bad_key_encoding", 400, 2},
      {failure_reason::bad_path_encoding, "bad_path_encoding", 400, 3},
      {failure_reason::bad_cursor, "bad_cursor", 400, 4},
      {failure_reason::bad_limit, "bad_limit", 400, 5},
      {failure_reason::bad_position, "bad_position", 400, 6},
      {failure_reason::unknown_parameter, "unknown_parameter", 400, 7},
      {failure_reason::bad_body, "bad_body", 400, 8},
      {failure_reason::answer_too_large, "answer_too_large", 400, 9},
      {failure_reason::method_not_allowed, "method_not_allowed", 405, 1},
      {failure_reason::not_acceptable, "not_acceptable", 406, 1},
      {failure_reason::payload_too_large, "payload_too_large", 413, 1},
      {failure_reason::uri_too_long, "uri_too_long", 414, 1},
      {failure_reason::unsupported_media, "unsupported_media", 415, 1},
      {failure_reason::headers_too_large, "headers_too_large", 431, 1},
      {failure_reason::internal, "internal", 500, 1},
      {failure_reason::not_caught_up, "not_caught_up", 503, 1},
      {failure_reason::not_owner, "not_owner", 503, 2},
      {failure_reason::shutting_down, "shutting_down", 503, 3},
      {failure_reason::position_not_reached, "position_not_reached", 503, 4},
      {failure_reason::scan_capacity, "scan_capacity", 503, 5},
      {failure_reason::too_many_connections, "too_many_connections", 503, 6},
      {failure_reason::too_many_waits, "too_many_waits", 503, 7},
      {failure_reason::busy, "busy", 503, 8},
      {failure_reason::unauthenticated, "unauthenticated", 401, 1},
      {failure_reason::forbidden, "forbidden", 403, 1},
      {failure_reason::bad_peer, "bad_peer", 401, 2},
      {failure_reason::history_gone, "history_gone", 410, 1},
      {failure_reason::subscription_capacity, "subscription_capacity", 503, 9},
      {failure_reason::version_history_gone, "version_history_gone", 410, 2},
  };
  // Every enumerator is in the table above: version_history_gone is the last one.
  CHECK(std::size(rows) == static_cast<std::size_t>(failure_reason::version_history_gone) + 1);

  for (const auto& row : rows) {
    CAPTURE(row.name);
    const auto info = describe(row.reason);
    CHECK(info.status == row.status);
    CHECK(info.error_code == static_cast<int>(row.status) * 100 + row.subcode);
    CHECK_FALSE(info.title.empty());

    const auto res = problem(row.reason, "what happened", "/v1/stores/s", 7);
    CHECK(res.status == row.status);
    CHECK(res.content_type == "application/problem+json");
    const auto body = nlohmann::json::parse(res.body);
    CHECK(body.at("type") == std::string("/problems/") + row.name);
    CHECK(name_of(row.reason) == row.name);
    CHECK(body.at("title") == std::string(info.title));
    CHECK(body.at("status") == row.status);
    CHECK(body.at("detail") == "what happened");
    CHECK(body.at("instance") == "/v1/stores/s");
    CHECK(body.at("error_code") == info.error_code);

    int retry_after_headers = 0;
    for (const auto& [n, v] : res.headers) {
      if (n == "Retry-After") {
        ++retry_after_headers;
        CHECK(v == "7");
      }
    }
    CHECK(retry_after_headers == (row.status == 503 ? 1 : 0));
  }
}

TEST_CASE("problem: instance is omitted when empty, non-UTF-8 detail does not throw") {
  const auto res = problem(failure_reason::bad_key_encoding, std::string("key \xFF\xFE", 6));
  const auto body = nlohmann::json::parse(res.body);
  CHECK_FALSE(body.contains("instance"));
  CHECK(body.at("detail").get<std::string>().rfind("key ", 0) == 0);
}

TEST_CASE("render_server_error: the HTTP server's own errors use the table's rows") {
  using kstate::http::server_error;
  const std::pair<server_error, failure_reason> rows[] = {
      {server_error::bad_request, failure_reason::bad_request},
      {server_error::bad_target, failure_reason::bad_path_encoding},
      {server_error::payload_too_large, failure_reason::payload_too_large},
      {server_error::uri_too_long, failure_reason::uri_too_long},
      {server_error::headers_too_large, failure_reason::headers_too_large},
      {server_error::internal, failure_reason::internal},
      {server_error::overloaded, failure_reason::too_many_connections},
  };
  for (const auto& [e, reason] : rows) {
    const auto res = render_server_error(e, "detail", "/x");
    const auto body = nlohmann::json::parse(res.body);
    CHECK(res.status == describe(reason).status);
    CHECK(body.at("error_code") == describe(reason).error_code);
  }
}
