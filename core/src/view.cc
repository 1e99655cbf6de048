#include "core/view.h"

namespace kstate {

const char* to_string(data_format f) noexcept {
  switch (f) {
    case data_format::string: return "string";
    case data_format::json: return "json";
    case data_format::bytes: return "bytes";
  }
  return "unknown";
}

const char* to_string(view_kind k) noexcept {
  switch (k) {
    case view_kind::table: return "table";
    case view_kind::count: return "count";
    case view_kind::sum: return "sum";
    case view_kind::reduce: return "reduce";
    case view_kind::aggregate: return "aggregate";
  }
  return "unknown";
}

const char* to_string(group_by_kind g) noexcept {
  switch (g) {
    case group_by_kind::key: return "key";
    case group_by_kind::json: return "json";
    case group_by_kind::words: return "words";
  }
  return "unknown";
}

const char* to_string(reduce_op r) noexcept {
  switch (r) {
    case reduce_op::latest: return "latest";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
  }
  return "unknown";
}

const char* to_string(agg_field f) noexcept {
  switch (f) {
    case agg_field::count: return "count";
    case agg_field::sum: return "sum";
    case agg_field::min: return "min";
    case agg_field::max: return "max";
    case agg_field::mean: return "mean";
  }
  return "unknown";
}

bool parse_data_format(std::string_view s, data_format& out) noexcept {
  if (s == "string") out = data_format::string;
  else if (s == "json") out = data_format::json;
  else if (s == "bytes") out = data_format::bytes;
  else return false;
  return true;
}

bool parse_view_kind(std::string_view s, view_kind& out) noexcept {
  if (s == "table") out = view_kind::table;
  else if (s == "count") out = view_kind::count;
  else if (s == "sum") out = view_kind::sum;
  else if (s == "reduce") out = view_kind::reduce;
  else if (s == "aggregate") out = view_kind::aggregate;
  else return false;
  return true;
}

bool parse_reduce_op(std::string_view s, reduce_op& out) noexcept {
  if (s == "latest") out = reduce_op::latest;
  else if (s == "min") out = reduce_op::min;
  else if (s == "max") out = reduce_op::max;
  else return false;
  return true;
}

bool parse_agg_field(std::string_view s, agg_field& out) noexcept {
  if (s == "count") out = agg_field::count;
  else if (s == "sum") out = agg_field::sum;
  else if (s == "min") out = agg_field::min;
  else if (s == "max") out = agg_field::max;
  else if (s == "mean") out = agg_field::mean;
  else return false;
  return true;
}

}  // namespace kstate
