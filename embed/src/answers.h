#pragma once
// The REST API's answers read back into the public types (internal to the embedding
// library). The API renders keys and values by the store's formats (server/
// json_render.h); these functions undo that rendering, so an in-process answer carries
// the bytes producers wrote (json values as the API prints them).
//
// Every function takes the response as the API gave it and never throws: a body that
// is not what the route answers is an `internal` error naming the route.

#include <string>
#include <vector>

#include "core/view.h"
#include "http/message.h"
#include "kstate/kstate.h"

namespace kstate::embed::detail {

// The error a non-200 answer stands for (problem+json: status, error_code, detail,
// Retry-After).
error error_of(const http::response& r);

// GET /v1/stores/{store}/keys/{key}: 200, or the 404 of an absent key (value nullopt).
result<key_result> read_key_answer(const view_def& v, const http::response& r);
// POST .../keys:batchGet: the entries in the order of `keys` (serialized bytes).
result<multi_result> read_batch_answer(const view_def& v, const std::vector<std::string>& keys,
                                       const http::response& r);
// GET .../keys?...: one page.
result<range_page> read_range_answer(const view_def& v, const http::response& r);
// GET .../count.
result<count_result> read_count_answer(const http::response& r);
// GET .../windows/{key}.
result<windows_result> read_windows_answer(const http::response& r);
// GET .../windows?...: one page.
result<windows_page> read_windows_range_answer(const view_def& v, const http::response& r);

}  // namespace kstate::embed::detail
