#pragma once
// Talking to the other instances of the group: forwarding a request to the owner of
// its key's partition, and asking an owner for its part of a range, batch, count or
// cluster view. Every request is signed (peer_auth.h), marked with X-Kstate-Hop so it
// is never forwarded again, carries the caller's request id, and never the caller's
// token.

#include <chrono>
#include <functional>
#include <string>

#include "api/state.h"
#include "http/client.h"

namespace kstate::server::api {

// The header that marks a request as sent by another instance.
inline constexpr const char* hop_header = "X-Kstate-Hop";

// Response headers an answer of this API carries that a forwarded answer keeps (the
// owner's other headers are not ours to pass on); names compared case-insensitively.
bool kept_from_owner(const std::string& name);

// A signed request to another instance on behalf of `c`. `wait`: how long the peer may
// wait for a min_position the request carries (added to the forwarding deadline).
http::client_request peer_request(const state& st, const call& c, std::string method, std::string target,
                                  std::string body, std::chrono::milliseconds wait = {});

// Sends the request as it came to `plan.owner` and calls `finish` with the owner's
// answer (keeping only the headers this API answers with, plus X-Kstate-Forwarded-To),
// or with the stale fallback, or with 503 not_owner when the owner did not answer.
void forward(const state& st, const call& c, forward_plan plan, std::function<void(http::response)> finish);

// Asks `part.endpoint` for its part (then, with allow_stale, this instance's copy and
// `part.copies`, as peer_part says); `done` gets the part's body (a 200 answer), or the
// response to answer the whole request with instead.
void send_part(const state& st, const call& c, const peer_part& part, std::function<void(part_result)> done);

}  // namespace kstate::server::api
