// Fuzz target: the framing of batched forwarded requests
// (server/src/api/forward_batch.h), which an instance decodes from a peer's body.
//
// Input: any bytes, read as a batch of requests and as a batch of answers. Decoding
// never crashes or reads past the input; what decodes fits the documented bounds, and
// the framing has one encoding for each content, so encoding what was decoded gives
// back exactly the input.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "api/forward_batch.h"
#include "fuzz_check.h"

using namespace kstate::server::api;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  if (auto requests = decode_forward_requests(body); requests.ok()) {
    FUZZ_CHECK(!requests->empty() && requests->size() <= max_forwards_per_batch);
    for (const auto& r : *requests) {
      FUZZ_CHECK(fits_forward_batch(r));
      FUZZ_CHECK(r.target.front() == '/');
    }
    FUZZ_CHECK(encode_forward_requests(*requests) == body);
  }
  if (auto answers = decode_forward_responses(body); answers.ok()) {
    FUZZ_CHECK(answers->size() <= max_forwards_per_batch);
    for (const auto& a : *answers) {
      FUZZ_CHECK(a.status == 0 || (a.status >= 100 && a.status <= 599));
      FUZZ_CHECK(a.headers.size() <= max_forward_response_headers);
    }
    FUZZ_CHECK(encode_forward_responses(*answers) == body);
  }
  return 0;
}
