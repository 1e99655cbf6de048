#include "ingest/fk_join.h"

#include <nlohmann/json.hpp>

#include "core/json_check.h"
#include "json_path.h"

namespace kstate::ingest {
namespace {

using json = nlohmann::json;

void put_u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}
void put_i64(std::string& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>((u >> shift) & 0xff));
}
// Reads a big-endian number of `n` bytes at the front of `in` and drops them.
bool take(std::string_view& in, size_t n, uint64_t& out) {
  if (in.size() < n) return false;
  out = 0;
  for (size_t i = 0; i < n; ++i) out = (out << 8) | static_cast<uint8_t>(in[i]);
  in.remove_prefix(n);
  return true;
}
bool take_u32(std::string_view& in, uint32_t& out) {
  uint64_t v = 0;
  if (!take(in, 4, v)) return false;
  out = static_cast<uint32_t>(v);
  return true;
}
bool take_i64(std::string_view& in, int64_t& out) {
  uint64_t v = 0;
  if (!take(in, 8, v) || v > static_cast<uint64_t>(INT64_MAX)) return false;
  out = static_cast<int64_t>(v);
  return true;
}

void note(std::string* why, const char* text) {
  if (why) *why = text;
}

}  // namespace

std::optional<std::string> foreign_key_of(std::string_view left_value, std::string_view path, data_format key_format,
                                          int max_json_depth, std::string* why) {
  if (check_json(left_value, max_json_depth) != json_verdict::ok) {
    note(why, "left value is not JSON within the depth bound");
    return std::nullopt;
  }
  auto doc = json::parse(left_value.begin(), left_value.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    note(why, "left value is not JSON");
    return std::nullopt;
  }
  const json* f = json_at_path(doc, path);
  if (!f) {
    note(why, "foreign-key field missing");
    return std::nullopt;
  }
  if (f->is_string()) {
    if (key_format == data_format::json) return f->dump(-1, ' ', false, json::error_handler_t::replace);
    return f->get<std::string>();
  }
  if (f->is_number()) return f->dump();
  note(why, "foreign-key field is not a string or a number");
  return std::nullopt;
}

std::string encode_fk_message(const fk_message& m) {
  std::string out;
  switch (m.kind) {
    case fk_message_kind::right:
      out.push_back(fk_right_marker);
      if (m.value) out.append(*m.value);
      break;
    case fk_message_kind::subscribe:
      out.push_back(fk_subscribe_marker);
      put_u32(out, static_cast<uint32_t>(m.left_partition));
      put_i64(out, m.version);
      out.append(m.left_key);
      break;
    case fk_message_kind::unsubscribe:
      out.push_back(fk_unsubscribe_marker);
      put_i64(out, m.version);
      out.append(m.left_key);
      break;
    case fk_message_kind::response:
      out.push_back(fk_response_marker);
      put_i64(out, m.version);
      out.push_back(m.value ? '\x01' : '\x00');
      if (m.value) out.append(*m.value);
      break;
  }
  return out;
}

std::optional<fk_message> decode_fk_message(std::string_view bytes) {
  if (bytes.empty()) return std::nullopt;
  const char marker = bytes.front();
  bytes.remove_prefix(1);
  fk_message m;
  switch (marker) {
    case fk_right_marker:
      m.kind = fk_message_kind::right;
      if (!bytes.empty()) m.value = std::string(bytes);
      return m;
    case fk_subscribe_marker: {
      m.kind = fk_message_kind::subscribe;
      uint32_t p = 0;
      if (!take_u32(bytes, p) || p > static_cast<uint32_t>(INT32_MAX) || !take_i64(bytes, m.version))
        return std::nullopt;
      m.left_partition = static_cast<int32_t>(p);
      m.left_key = std::string(bytes);
      return m;
    }
    case fk_unsubscribe_marker:
      m.kind = fk_message_kind::unsubscribe;
      if (!take_i64(bytes, m.version)) return std::nullopt;
      m.left_key = std::string(bytes);
      return m;
    case fk_response_marker: {
      m.kind = fk_message_kind::response;
      if (!take_i64(bytes, m.version) || bytes.empty()) return std::nullopt;
      const char present = bytes.front();
      bytes.remove_prefix(1);
      if (present == '\x01') m.value = std::string(bytes);
      else if (present != '\x00' || !bytes.empty()) return std::nullopt;
      return m;
    }
    default: return std::nullopt;
  }
}

// flags (bit 0 left, 1 fk, 2 answered, 3 right), version (8), fk length (4), left
// length (4), fk, left, right.
std::string encode_fk_left_row(const fk_left_row& r) {
  if (r.empty()) return {};
  std::string out;
  out.push_back(static_cast<char>((r.left ? 1 : 0) | (r.fk ? 2 : 0) | (r.answered ? 4 : 0) | (r.right ? 8 : 0)));
  put_i64(out, r.version < 0 ? 0 : r.version);
  put_u32(out, static_cast<uint32_t>(r.fk ? r.fk->size() : 0));
  put_u32(out, static_cast<uint32_t>(r.left->size()));
  if (r.fk) out.append(*r.fk);
  out.append(*r.left);
  if (r.right) out.append(*r.right);
  return out;
}

std::optional<fk_left_row> decode_fk_left_row(std::string_view bytes) {
  if (bytes.empty()) return std::nullopt;
  const auto flags = static_cast<uint8_t>(bytes.front());
  bytes.remove_prefix(1);
  if (!(flags & 1) || flags > 15) return std::nullopt;
  fk_left_row r;
  uint32_t fk_len = 0, left_len = 0;
  if (!take_i64(bytes, r.version) || !take_u32(bytes, fk_len) || !take_u32(bytes, left_len)) return std::nullopt;
  if (static_cast<uint64_t>(fk_len) + left_len > bytes.size()) return std::nullopt;
  if (!(flags & 2) && fk_len != 0) return std::nullopt;
  if (flags & 2) r.fk = std::string(bytes.substr(0, fk_len));
  else r.version = -1;
  r.left = std::string(bytes.substr(fk_len, left_len));
  auto rest = bytes.substr(static_cast<size_t>(fk_len) + left_len);
  r.answered = (flags & 4) != 0;
  if (flags & 8) r.right = std::string(rest);
  else if (!rest.empty()) return std::nullopt;
  return r;
}

std::string encode_fk_subscription(const fk_subscription& s) {
  std::string out;
  put_u32(out, static_cast<uint32_t>(s.left_partition));
  put_i64(out, s.version);
  return out;
}

std::optional<fk_subscription> decode_fk_subscription(std::string_view bytes) {
  fk_subscription s;
  uint32_t p = 0;
  if (bytes.size() != 12 || !take_u32(bytes, p) || p > static_cast<uint32_t>(INT32_MAX) || !take_i64(bytes, s.version))
    return std::nullopt;
  s.left_partition = static_cast<int32_t>(p);
  return s;
}

std::string fk_right_key(std::string_view fk) {
  std::string out(1, 'r');
  out.append(fk);
  return out;
}

std::string fk_subscription_prefix(std::string_view fk) {
  std::string out(1, 's');
  put_u32(out, static_cast<uint32_t>(fk.size()));
  out.append(fk);
  return out;
}

fk_left_step fk_apply_left(fk_left_row row, std::string_view left_key, int32_t left_partition,
                           std::optional<std::string_view> value, std::optional<std::string> fk, int64_t version) {
  fk_left_step step;
  if (!value) fk.reset();
  // Leaving a foreign key: its side forgets the subscription (older than this record).
  if (row.fk && row.fk != fk) {
    fk_message m;
    m.kind = fk_message_kind::unsubscribe;
    m.left_key = std::string(left_key);
    m.version = version;
    step.send.push_back({*row.fk, std::move(m)});
  }
  if (fk && fk != row.fk) {
    // A new foreign key: the right value is unknown until the answer of this version.
    fk_message m;
    m.kind = fk_message_kind::subscribe;
    m.left_key = std::string(left_key);
    m.left_partition = left_partition;
    m.version = version;
    step.send.push_back({*fk, std::move(m)});
    row.version = version;
    row.answered = false;
    row.right.reset();
  } else if (!fk) {
    row.version = -1;
    row.answered = false;
    row.right.reset();
  }
  // Same foreign key: the subscription, its version and its answer stay.
  row.fk = std::move(fk);
  row.left = value ? std::optional<std::string>(std::string(*value)) : std::nullopt;
  if (!row.left) row = fk_left_row{};
  step.row = std::move(row);
  return step;
}

bool fk_apply_response(fk_left_row& row, int64_t version, std::optional<std::string_view> right) {
  if (!row.left || !row.fk || row.version != version) return false;
  row.answered = true;
  row.right = right ? std::optional<std::string>(std::string(*right)) : std::nullopt;
  return true;
}

join_sides fk_sides(const fk_left_row& row) {
  join_sides s;
  if (!row.left) return s;
  if (row.fk && !row.answered) return s;
  s.left = row.left;
  if (row.fk) s.right = row.right;
  return s;
}

std::optional<fk_subscription> fk_apply_subscribe(const std::optional<fk_subscription>& existing,
                                                  const fk_message& subscribe) {
  if (existing && existing->version >= subscribe.version) return std::nullopt;
  return fk_subscription{subscribe.left_partition, subscribe.version};
}

fk_response fk_answer(std::string_view left_key, const fk_subscription& s, const std::optional<std::string>& right) {
  fk_response r;
  r.left_key = std::string(left_key);
  r.left_partition = s.left_partition;
  r.message.kind = fk_message_kind::response;
  r.message.version = s.version;
  r.message.value = right;
  return r;
}

bool fk_unsubscribe_removes(const std::optional<fk_subscription>& existing, const fk_message& unsubscribe) {
  return existing && existing->version < unsubscribe.version;
}

}  // namespace kstate::ingest
