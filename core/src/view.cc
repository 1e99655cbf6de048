#include "core/view.h"

#include <utility>

namespace kstate {
namespace {

// One table per enum: its values and their configuration names, read both ways.
template <typename E>
using names = std::pair<E, const char*>;

constexpr names<data_format> data_formats[] = {
    {data_format::string, "string"}, {data_format::json, "json"}, {data_format::bytes, "bytes"}};
constexpr names<view_kind> view_kinds[] = {
    {view_kind::table, "table"},   {view_kind::count, "count"},         {view_kind::sum, "sum"},
    {view_kind::reduce, "reduce"}, {view_kind::aggregate, "aggregate"}, {view_kind::join, "join"}};
constexpr names<join_type> join_types[] = {
    {join_type::inner, "inner"}, {join_type::left, "left"}, {join_type::outer, "outer"}};
constexpr names<group_by_kind> group_by_kinds[] = {
    {group_by_kind::key, "key"}, {group_by_kind::json, "json"}, {group_by_kind::words, "words"}};
constexpr names<reduce_op> reduce_ops[] = {
    {reduce_op::latest, "latest"}, {reduce_op::min, "min"}, {reduce_op::max, "max"}};
constexpr names<agg_field> agg_fields[] = {{agg_field::count, "count"},
                                           {agg_field::sum, "sum"},
                                           {agg_field::min, "min"},
                                           {agg_field::max, "max"},
                                           {agg_field::mean, "mean"}};
constexpr names<ttl_clock> ttl_clocks[] = {{ttl_clock::record_time, "record_time"},
                                           {ttl_clock::ingest_time, "ingest_time"}};

template <typename E, std::size_t N>
const char* name_in(const names<E> (&table)[N], E value) noexcept {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "unknown";
}

template <typename E, std::size_t N>
bool parse_in(const names<E> (&table)[N], std::string_view s, E& out) noexcept {
  for (const auto& [v, name] : table) {
    if (s == name) {
      out = v;
      return true;
    }
  }
  return false;
}

}  // namespace

const char* to_string(data_format f) noexcept { return name_in(data_formats, f); }
const char* to_string(view_kind k) noexcept { return name_in(view_kinds, k); }
const char* to_string(group_by_kind g) noexcept { return name_in(group_by_kinds, g); }
const char* to_string(reduce_op r) noexcept { return name_in(reduce_ops, r); }
const char* to_string(agg_field f) noexcept { return name_in(agg_fields, f); }
const char* to_string(ttl_clock c) noexcept { return name_in(ttl_clocks, c); }
const char* to_string(join_type t) noexcept { return name_in(join_types, t); }

bool parse_data_format(std::string_view s, data_format& out) noexcept { return parse_in(data_formats, s, out); }
bool parse_view_kind(std::string_view s, view_kind& out) noexcept { return parse_in(view_kinds, s, out); }
bool parse_join_type(std::string_view s, join_type& out) noexcept { return parse_in(join_types, s, out); }

bool parse_reduce_op(std::string_view s, reduce_op& out) noexcept { return parse_in(reduce_ops, s, out); }
bool parse_agg_field(std::string_view s, agg_field& out) noexcept { return parse_in(agg_fields, s, out); }
bool parse_ttl_clock(std::string_view s, ttl_clock& out) noexcept { return parse_in(ttl_clocks, s, out); }

std::vector<std::string> column_family_names(const std::vector<view_def>& views) {
  std::vector<std::string> out;
  for (const auto& v : views) {
    out.push_back(v.name);
    if (v.is_join()) out.push_back(join_sides_name(v));
    if (v.is_fk_join()) out.push_back(fk_right_name(v));
  }
  return out;
}

}  // namespace kstate
