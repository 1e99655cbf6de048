#pragma once
// Helpers of the configuration parser (internal to server): the error it throws and the
// typed reads of YAML nodes, shared by config.cc and the files that parse one part of a
// view (config_join.cc).

#include <yaml-cpp/yaml.h>

#include <set>
#include <string>
#include <vector>

#include "core/view.h"

namespace kstate::server::config_detail {

// Thrown inside the parser, turned into a status at the edge.
struct config_error {
  std::string key;
  std::string message;
};

[[noreturn]] inline void fail(const std::string& key, const std::string& message) { throw config_error{key, message}; }

inline void check_keys(const YAML::Node& node, const std::string& where, const std::set<std::string>& allowed) {
  if (!node.IsMap()) fail(where, "must be a mapping");
  for (const auto& kv : node) {
    auto k = kv.first.as<std::string>();
    if (!allowed.count(k)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(where.empty() ? k : where + "." + k, "unknown key (allowed: " + list + ")");
    }
  }
}

inline std::string get_string(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail(key, "must be a string");
  return n.as<std::string>();
}

inline bool get_bool(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail(key, "must be true or false");
  try {
    return n.as<bool>();
  } catch (const YAML::Exception&) {
    fail(key, "must be true or false (got '" + n.Scalar() + "')");
  }
}

template <typename T>
T get_number(const YAML::Node& n, const std::string& key, T min, T max) {
  if (!n.IsScalar()) fail(key, "must be a number");
  T v{};
  try {
    v = n.as<T>();
  } catch (const YAML::Exception&) {
    fail(key, "must be a number (got '" + n.Scalar() + "')");
  }
  if (v < min || v > max)
    fail(key, "must be between " + std::to_string(min) + " and " + std::to_string(max) + " (got " + n.Scalar() + ")");
  return v;
}

// The join-only keys of a view (kind join): `join: {type, right, right_partitioner,
// left_name, right_name, select}`. Sets v.join; value_format must be json.
void parse_join(const YAML::Node& n, const std::string& where, view_def& v);
// Co-partitioning as far as configuration tells it: every view reading a join's input
// topic declares the partitioner the join declares for it, and both inputs of a join
// declare one partitioner. Completes right_partitioner (default: the view's).
void check_join_inputs(std::vector<view_def>& views);

}  // namespace kstate::server::config_detail
