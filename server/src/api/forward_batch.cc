#include "api/forward_batch.h"

namespace kstate::server::api {
namespace {

constexpr std::string_view magic = "KSF1";

void put_u16(std::string& out, std::size_t v) {
  out.push_back(static_cast<char>((v >> 8) & 0xff));
  out.push_back(static_cast<char>(v & 0xff));
}

void put_str(std::string& out, std::string_view s) {
  const auto n = static_cast<uint32_t>(s.size());
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((n >> shift) & 0xff));
  out.append(s);
}

// Reads the framing front to back; every read checks what remains. The first failure
// sticks, so a decoder checks ok() once per item rather than after every field.
class reader {
 public:
  explicit reader(std::string_view in) : in_(in) {}

  bool ok() const { return ok_; }
  bool at_end() const { return in_.empty(); }
  std::size_t remaining() const { return in_.size(); }

  bool magic_ok() {
    if (!ok_ || in_.substr(0, magic.size()) != magic) return ok_ = false;
    in_.remove_prefix(magic.size());
    return true;
  }
  uint32_t u8() { return fixed(1); }
  uint32_t u16() { return fixed(2); }
  // A string of at most `max` bytes.
  std::string_view str(std::size_t max) {
    const uint32_t n = fixed(4);
    if (!ok_ || n > max || n > in_.size()) {
      ok_ = false;
      return {};
    }
    auto s = in_.substr(0, n);
    in_.remove_prefix(n);
    return s;
  }

 private:
  uint32_t fixed(std::size_t bytes) {
    if (!ok_ || in_.size() < bytes) {
      ok_ = false;
      return 0;
    }
    uint32_t v = 0;
    for (std::size_t i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(in_[i]);
    in_.remove_prefix(bytes);
    return v;
  }

  std::string_view in_;
  bool ok_ = true;
};

status malformed(const char* what) { return status::invalid_argument(std::string("malformed batch: ") + what); }

// The smallest encoded item: a request has a flags byte and four length prefixes, a
// response a status, a content type, a header count and a body. A count above what
// the remaining bytes can hold is refused before anything is reserved for it.
constexpr std::size_t min_request_bytes = 1 + 4 * 4;
constexpr std::size_t min_response_bytes = 2 + 4 + 2 + 4;

}  // namespace

bool fits_forward_batch(const forward_sub_request& r) {
  return !r.target.empty() && r.target.size() <= max_forward_target_bytes &&
         (!r.accept || r.accept->size() <= max_forward_header_bytes) &&
         (!r.content_type || r.content_type->size() <= max_forward_header_bytes) &&
         r.request_id.size() <= max_forward_request_id_bytes;
}

std::string encode_forward_requests(const std::vector<forward_sub_request>& requests) {
  std::string out(magic);
  put_u16(out, requests.size());
  for (const auto& r : requests) {
    out.push_back(static_cast<char>((r.accept ? 1 : 0) | (r.content_type ? 2 : 0)));
    put_str(out, r.target);
    put_str(out, r.accept.value_or(""));
    put_str(out, r.content_type.value_or(""));
    put_str(out, r.request_id);
  }
  return out;
}

result<std::vector<forward_sub_request>> decode_forward_requests(std::string_view body) {
  reader in(body);
  if (!in.magic_ok()) return malformed("no KSF1 header");
  const std::size_t count = in.u16();
  if (!in.ok() || count == 0 || count > max_forwards_per_batch || count > in.remaining() / min_request_bytes)
    return malformed("request count out of range");
  std::vector<forward_sub_request> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    forward_sub_request r;
    const uint32_t flags = in.u8();
    r.target = in.str(max_forward_target_bytes);
    auto accept = in.str(max_forward_header_bytes);
    auto content_type = in.str(max_forward_header_bytes);
    r.request_id = in.str(max_forward_request_id_bytes);
    if (!in.ok()) return malformed("truncated or oversized request");
    if (flags > 3) return malformed("unknown request flags");
    if (flags & 1) r.accept = std::string(accept);
    else if (!accept.empty()) return malformed("accept without its flag");
    if (flags & 2) r.content_type = std::string(content_type);
    else if (!content_type.empty()) return malformed("content type without its flag");
    if (r.target.empty() || r.target.front() != '/') return malformed("target not in origin form");
    out.push_back(std::move(r));
  }
  if (!in.at_end()) return malformed("trailing bytes");
  return out;
}

std::string encode_forward_responses(const std::vector<forward_sub_response>& responses) {
  std::size_t size = magic.size() + 2;
  for (const auto& r : responses) {
    size += min_response_bytes + r.content_type.size() + r.body.size();
    for (const auto& [n, v] : r.headers) size += 8 + n.size() + v.size();
  }
  std::string out;
  out.reserve(size);
  out.append(magic);
  put_u16(out, responses.size());
  for (const auto& r : responses) {
    put_u16(out, r.status);
    put_str(out, r.content_type);
    put_u16(out, r.headers.size());
    for (const auto& [n, v] : r.headers) {
      put_str(out, n);
      put_str(out, v);
    }
    put_str(out, r.body);
  }
  return out;
}

result<std::vector<forward_sub_response>> decode_forward_responses(std::string_view body) {
  reader in(body);
  if (!in.magic_ok()) return malformed("no KSF1 header");
  const std::size_t count = in.u16();
  if (!in.ok() || count > max_forwards_per_batch || count > in.remaining() / min_response_bytes)
    return malformed("response count out of range");
  std::vector<forward_sub_response> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    forward_sub_response r;
    r.status = in.u16();
    r.content_type = in.str(max_forward_header_bytes);
    const std::size_t headers = in.u16();
    if (!in.ok() || headers > max_forward_response_headers) return malformed("truncated response or too many headers");
    for (std::size_t h = 0; h < headers; ++h) {
      auto name = in.str(max_forward_response_header_bytes);
      auto value = in.str(max_forward_response_header_bytes);
      if (!in.ok() || name.empty()) return malformed("truncated or oversized header");
      r.headers.emplace_back(name, value);
    }
    r.body = in.str(in.remaining());
    if (!in.ok()) return malformed("truncated response");
    if (r.status != 0 && (r.status < 100 || r.status > 599)) return malformed("status out of range");
    out.push_back(std::move(r));
  }
  if (!in.at_end()) return malformed("trailing bytes");
  return out;
}

}  // namespace kstate::server::api
