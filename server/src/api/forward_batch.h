#pragma once
// The framing of a batch of forwarded requests (internal, peer to peer only): an
// instance sends one POST /v1/internal/forwards carrying several GET requests for keys
// the receiving instance owns, and gets one answer carrying each request's answer.
//
// Both directions are binary and length-prefixed, every integer big-endian:
//
//   requests  = "KSF1" u16:count { u8:flags str:target str:accept str:content_type str:request_id }
//   responses = "KSF1" u16:count { u16:status str:content_type u16:headers { str:name str:value } str:body }
//   str       = u32:length bytes
//
// A request's flags say which of accept (1) and content_type (2) were present (an
// absent header and an empty one differ). A response's status 0 means "not carried in
// the batch, send this request alone" (a streamed answer, or one too large for the
// batch). Decoding checks every length against what remains and against the bounds
// below, and rejects trailing bytes: a malformed body is an error, never a crash.
//
// Pure functions, no state: safe from any thread.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace kstate::server::api {

// The media type of both bodies.
inline constexpr std::string_view forwards_media_type = "application/x-kstate-forwards";
// The internal route's target.
inline constexpr std::string_view forwards_target = "/v1/internal/forwards";

// What a peer controls, bounded.
inline constexpr std::size_t max_forwards_per_batch = 1024;
inline constexpr std::size_t max_forward_target_bytes = 16 * 1024;
inline constexpr std::size_t max_forward_header_bytes = 1024;  // accept, content type
inline constexpr std::size_t max_forward_request_id_bytes = 128;
inline constexpr std::size_t max_forward_response_headers = 32;
inline constexpr std::size_t max_forward_response_header_bytes = 8 * 1024;  // a name or a value

// One GET request of a batch: the target and the few headers a forward carries.
struct forward_sub_request {
  std::string target;
  std::optional<std::string> accept;
  std::optional<std::string> content_type;
  std::string request_id;

  bool operator==(const forward_sub_request&) const = default;
};

// One answer of a batch. `status` 0: not carried, send the request alone.
struct forward_sub_response {
  unsigned status = 0;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  bool operator==(const forward_sub_response&) const = default;
};

// True when `r` fits the bounds above (a request that does not is forwarded alone).
bool fits_forward_batch(const forward_sub_request& r);

// The encoders expect what fits the bounds (the caller checks requests with
// fits_forward_batch; responses carry at most the headers an answer of this API has).
std::string encode_forward_requests(const std::vector<forward_sub_request>& requests);
result<std::vector<forward_sub_request>> decode_forward_requests(std::string_view body);

std::string encode_forward_responses(const std::vector<forward_sub_response>& responses);
result<std::vector<forward_sub_response>> decode_forward_responses(std::string_view body);

}  // namespace kstate::server::api
