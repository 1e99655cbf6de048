#include "ingest/join.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/json_check.h"
#include "json_path.h"

namespace kstate::ingest {
namespace {

using json = nlohmann::json;

// A side's value parsed for projection; null when absent or (never expected: both
// stages check it) not JSON within the depth bound.
json parse_side(const std::optional<std::string>& text, int max_json_depth) {
  if (!text || check_json(*text, max_json_depth) != json_verdict::ok) return json();
  auto doc = json::parse(text->begin(), text->end(), nullptr, /*allow_exceptions=*/false);
  return doc.is_discarded() ? json() : doc;
}

// A name as a JSON string (config names are UTF-8; anything else is replaced, not thrown).
std::string json_string(const std::string& name) {
  return json(name).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string encode_join_input(join_side side, std::optional<std::string_view> value) {
  std::string out(1, side == join_side::left ? join_left_marker : join_right_marker);
  if (value) out.append(*value);
  return out;
}

std::optional<join_input> decode_join_input(std::optional<std::string_view> value) {
  if (!value || value->empty()) return std::nullopt;
  join_input in{};
  if (value->front() == join_left_marker) in.side = join_side::left;
  else if (value->front() == join_right_marker) in.side = join_side::right;
  else return std::nullopt;
  if (value->size() > 1) in.value = value->substr(1);
  return in;
}

std::string encode_sides(const join_sides& s) {
  if (s.empty()) return {};
  std::string out;
  const size_t left = s.left ? s.left->size() : 0;
  out.reserve(5 + left + (s.right ? s.right->size() : 0));
  out.push_back(static_cast<char>((s.left ? 1 : 0) | (s.right ? 2 : 0)));
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((left >> shift) & 0xff));
  if (s.left) out.append(*s.left);
  if (s.right) out.append(*s.right);
  return out;
}

std::optional<join_sides> decode_sides(std::string_view bytes) {
  if (bytes.size() < 5) return std::nullopt;
  const auto flags = static_cast<uint8_t>(bytes[0]);
  if (flags == 0 || flags > 3) return std::nullopt;
  uint64_t left = 0;
  for (int i = 1; i <= 4; ++i) left = (left << 8) | static_cast<uint8_t>(bytes[i]);
  auto rest = bytes.substr(5);
  if (left > rest.size() || (!(flags & 1) && left != 0) || (!(flags & 2) && left != rest.size())) return std::nullopt;
  join_sides s;
  if (flags & 1) s.left = std::string(rest.substr(0, left));
  if (flags & 2) s.right = std::string(rest.substr(left));
  return s;
}

joiner::joiner(const view_def& view, int max_json_depth)
    : spec_(view.join.value_or(join_spec{})), max_json_depth_(max_json_depth) {
  left_head_ = "{" + json_string(spec_.left_name) + ":";
  right_head_ = "," + json_string(spec_.right_name) + ":";
  for (const auto& f : spec_.select) field_heads_.push_back(json_string(f.as) + ":");
}

std::optional<std::string> joiner::joined(const join_sides& s) const {
  switch (spec_.type) {
    case join_type::inner:
      if (!s.left || !s.right) return std::nullopt;
      break;
    case join_type::left:
      if (!s.left) return std::nullopt;
      break;
    case join_type::outer:
      if (s.empty()) return std::nullopt;
      break;
  }
  std::string out;
  if (spec_.select.empty()) {
    // Both values embedded as they are: validated JSON, never parsed here.
    out.reserve(left_head_.size() + right_head_.size() + 10 + (s.left ? s.left->size() : 4) +
                (s.right ? s.right->size() : 4));
    out += left_head_;
    out += s.left ? *s.left : "null";
    out += right_head_;
    out += s.right ? *s.right : "null";
    out += '}';
    return out;
  }
  const bool need_left =
      s.left && std::any_of(spec_.select.begin(), spec_.select.end(), [](const join_field& f) { return !f.right; });
  const bool need_right =
      s.right && std::any_of(spec_.select.begin(), spec_.select.end(), [](const join_field& f) { return f.right; });
  const json left = need_left ? parse_side(s.left, max_json_depth_) : json();
  const json right = need_right ? parse_side(s.right, max_json_depth_) : json();
  out += '{';
  for (size_t i = 0; i < spec_.select.size(); ++i) {
    const auto& f = spec_.select[i];
    if (i > 0) out += ',';
    out += field_heads_[i];
    const json* v = json_at_path(f.right ? right : left, f.path);
    out += v ? v->dump(-1, ' ', false, json::error_handler_t::replace) : "null";
  }
  out += '}';
  return out;
}

}  // namespace kstate::ingest
