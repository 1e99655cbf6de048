// Configuration of join views (kind join): the `join:` map and the checks that span
// views (co-partitioned inputs). docs/configuration.md#join-views is the user's version.
#include <algorithm>
#include <regex>

#include "config_parse.h"

namespace kstate::server::config_detail {
namespace {

// A select list is a bounded part of each joined value (it is built per update).
constexpr size_t max_select_fields = 256;

bool dotted_path(const std::string& p) {
  if (p.empty() || p.front() == '.' || p.back() == '.') return false;
  return p.find("..") == std::string::npos;
}

std::string last_segment(const std::string& path) {
  auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

}  // namespace

void parse_join(const YAML::Node& n, const std::string& where, view_def& v) {
  for (const char* k : {"group_by", "value", "reduce", "fields", "repartition_partitions", "window", "ttl"})
    if (n[k]) fail(where + "." + k, "does not apply to join views (kind join)");
  const std::string jw = where + ".join";
  auto j = n["join"];
  if (!j || !j.IsMap())
    fail(jw, "is required for kind join: {type: inner|left|outer, right: <topic>, left_name, right_name, select}");
  check_keys(j, jw, {"type", "right", "right_partitioner", "foreign_key", "left_name", "right_name", "select"});
  join_spec spec;
  if (j["type"]) {
    auto t = get_string(j["type"], jw + ".type");
    if (!parse_join_type(t, spec.type)) fail(jw + ".type", "must be one of: inner, left, outer (got '" + t + "')");
  }
  if (!j["right"]) fail(jw + ".right", "is required: the topic of the right table");
  spec.right_topic = get_string(j["right"], jw + ".right");
  if (spec.right_topic.empty()) fail(jw + ".right", "must not be empty");
  spec.right_partitioner.clear();  // completed by check_join_inputs: the view's partitioner
  if (j["right_partitioner"]) spec.right_partitioner = get_string(j["right_partitioner"], jw + ".right_partitioner");
  if (j["foreign_key"]) {
    spec.foreign_key = get_string(j["foreign_key"], jw + ".foreign_key");
    if (!dotted_path(spec.foreign_key))
      fail(jw + ".foreign_key",
           "must be a dotted path of the left value's field naming the right key, such as customer.id (got '" +
               spec.foreign_key + "')");
    if (spec.type == join_type::outer)
      fail(jw + ".type", "a foreign-key join is inner or left (an outer one has no key for a right-only row)");
  }
  if (j["left_name"]) spec.left_name = get_string(j["left_name"], jw + ".left_name");
  if (j["right_name"]) spec.right_name = get_string(j["right_name"], jw + ".right_name");
  if (spec.left_name.empty()) fail(jw + ".left_name", "must not be empty");
  if (spec.right_name.empty()) fail(jw + ".right_name", "must not be empty");
  if (spec.left_name == spec.right_name) fail(jw + ".right_name", "must differ from left_name");
  if (auto sel = j["select"]) {
    if (!sel.IsSequence() || sel.size() == 0)
      fail(jw + ".select", "must be a list of {side: left|right, field: <dotted path>, as: <name>}");
    if (sel.size() > max_select_fields)
      fail(jw + ".select", "at most " + std::to_string(max_select_fields) + " fields");
    for (size_t i = 0; i < sel.size(); ++i) {
      const std::string fw = jw + ".select[" + std::to_string(i) + "]";
      check_keys(sel[i], fw, {"side", "field", "as"});
      join_field f;
      if (!sel[i]["side"]) fail(fw + ".side", "is required: left or right");
      auto side = get_string(sel[i]["side"], fw + ".side");
      if (side != "left" && side != "right") fail(fw + ".side", "must be left or right (got '" + side + "')");
      f.right = side == "right";
      if (!sel[i]["field"]) fail(fw + ".field", "is required: the dotted path of a field of that side's value");
      f.path = get_string(sel[i]["field"], fw + ".field");
      if (!dotted_path(f.path))
        fail(fw + ".field", "must be a dotted path such as address.city (got '" + f.path + "')");
      f.as = sel[i]["as"] ? get_string(sel[i]["as"], fw + ".as") : last_segment(f.path);
      if (f.as.empty()) fail(fw + ".as", "must not be empty");
      for (const auto& other : spec.select)
        if (other.as == f.as) fail(fw + ".as", "duplicate name '" + f.as + "' in the joined value (set as:)");
      spec.select.push_back(std::move(f));
    }
    if (j["left_name"] || j["right_name"])
      fail(jw + ".select", "replaces left_name and right_name (the joined value is the selected fields)");
  }
  v.join = std::move(spec);
  if (n["replication_factor"])
    v.replication_factor = get_number<int>(n["replication_factor"], where + ".replication_factor", -1, 32);
  if (auto c = n["changelog_configs"]) {
    if (!c.IsMap()) fail(where + ".changelog_configs", "must map topic config names to values");
    for (const auto& kv : c) {
      auto k = kv.first.as<std::string>();
      v.changelog_configs[k] = get_string(kv.second, where + ".changelog_configs." + k);
      // The changelog keeps every key's sides: nothing may delete them but a tombstone.
      if (k == "cleanup.policy" && v.changelog_configs[k] != "compact")
        fail(where + ".changelog_configs.cleanup.policy", "must be compact for a join view");
    }
  }
  if (n["cache"]) v.cache = get_bool(n["cache"], where + ".cache");
  if (n["value_format"] && n["value_format"].IsScalar() && n["value_format"].Scalar() != "json")
    fail(where + ".value_format",
         "a join's inputs and joined values are JSON (got '" + n["value_format"].Scalar() + "')");
}

void check_join_inputs(std::vector<view_def>& views) {
  for (size_t i = 0; i < views.size(); ++i) {
    auto& v = views[i];
    if (!v.is_join()) continue;
    const std::string where = "views[" + std::to_string(i) + "]";
    auto& spec = *v.join;
    if (spec.right_partitioner.empty()) spec.right_partitioner = v.partitioner;
    if (spec.right_partitioner != "murmur2" && spec.right_partitioner != "consistent" &&
        spec.right_partitioner != "fnv1a")
      fail(where + ".join.right_partitioner",
           "must be one of: murmur2, consistent, fnv1a (got '" + spec.right_partitioner + "')");
    // A foreign-key join routes by each side's own partitioner: the inputs need not be
    // co-partitioned.
    if (!spec.by_foreign_key() && spec.right_partitioner != v.partitioner)
      fail(where + ".join.right_partitioner",
           "the inputs are not co-partitioned: topic '" + v.input_topic() + "' is partitioned by " + v.partitioner +
               ", topic '" + spec.right_topic + "' by " + spec.right_partitioner +
               " (a join needs the same partitioner and partition count on both inputs)");
    for (size_t k = 0; k < views.size(); ++k) {
      const auto& t = views[k];
      if (t.is_aggregate()) continue;
      const std::string& expected = t.topic == v.input_topic()    ? v.partitioner
                                    : t.topic == spec.right_topic ? spec.right_partitioner
                                                                  : t.partitioner;
      if (t.partitioner != expected)
        fail(where + ".partitioner", "view '" + t.name + "' reads topic '" + t.topic + "' as partitioned by " +
                                         t.partitioner + ", join view '" + v.name + "' by " + expected +
                                         " (one topic has one partitioner)");
    }
  }
}

}  // namespace kstate::server::config_detail
