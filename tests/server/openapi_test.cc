// docs/openapi.json (served at /openapi.json) must describe exactly the router: the
// same (method, path) pairs, the same query parameters per route, and only error codes
// of the problem table. A route added to api.cc without the spec (or the reverse)
// fails here, naming the route.

#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "server/api.h"
#include "server/problem.h"

#ifndef KSTATE_OPENAPI_FILE
#error "KSTATE_OPENAPI_FILE must name docs/openapi.json (see tests/server/CMakeLists.txt)"
#endif

namespace {

using json = nlohmann::json;
using kstate::server::failure_reason;

// The spec file can be swapped for a deliberately broken copy when checking that this
// test fails: KSTATE_OPENAPI_SPEC overrides the built-in path.
std::string spec_path() {
  if (const char* p = std::getenv("KSTATE_OPENAPI_SPEC"); p && *p) return p;
  return KSTATE_OPENAPI_FILE;
}

const json& spec() {
  static const json s = [] {
    std::ifstream in(spec_path());
    REQUIRE_MESSAGE(in.good(), "cannot open ", spec_path());
    std::stringstream buf;
    buf << in.rdbuf();
    return json::parse(buf.str());
  }();
  return s;
}

const std::vector<std::string> http_methods = {"get", "put", "post", "delete", "options", "head", "patch", "trace"};

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

// Follows a local "$ref" ("#/components/...") until a non-reference object.
const json& resolve(const json& node) {
  const json* n = &node;
  for (int depth = 0; n->is_object() && n->contains("$ref"); ++depth) {
    REQUIRE_MESSAGE(depth < 16, "$ref cycle at ", node.dump());
    const auto ref = (*n)["$ref"].get<std::string>();
    REQUIRE_MESSAGE(ref.rfind("#/", 0) == 0, "only local references are expected: ", ref);
    const json::json_pointer ptr(ref.substr(1));
    REQUIRE_MESSAGE(spec().contains(ptr), "dangling $ref ", ref);
    n = &spec().at(ptr);
  }
  return *n;
}

struct operation {
  std::string method, path;
  const json* op;
  // Parameters of the path item and of the operation, references resolved; the
  // operation's override the path item's of the same (in, name), as OpenAPI says.
  std::map<std::pair<std::string, std::string>, const json*> params;
};

std::string name_of(const std::string& method, const std::string& path) { return method + " " + path; }

std::vector<operation> spec_operations() {
  std::vector<operation> out;
  for (const auto& [path, item_ref] : spec().at("paths").items()) {
    const json& item = resolve(item_ref);
    for (const auto& m : http_methods) {
      if (!item.contains(m)) continue;
      operation o{upper(m), path, &item.at(m), {}};
      for (const json* level : {&item, o.op}) {
        if (!level->contains("parameters")) continue;
        for (const auto& p : level->at("parameters")) {
          const json& r = resolve(p);
          o.params[{r.at("in").get<std::string>(), r.at("name").get<std::string>()}] = &r;
        }
      }
      out.push_back(std::move(o));
    }
  }
  return out;
}

// "{store}", "{key}" in a path template.
std::set<std::string> template_params(const std::string& path) {
  std::set<std::string> out;
  for (size_t open = path.find('{'); open != std::string::npos; open = path.find('{', open + 1)) {
    auto close = path.find('}', open);
    REQUIRE_MESSAGE(close != std::string::npos, "unbalanced braces in ", path);
    out.insert(path.substr(open + 1, close - open - 1));
  }
  return out;
}

std::set<std::string> params_in(const operation& o, const std::string& where) {
  std::set<std::string> out;
  for (const auto& [key, p] : o.params)
    if (key.first == where) out.insert(key.second);
  return out;
}

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
  return out.empty() ? "(none)" : out;
}

std::set<std::string> minus(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::set<std::string> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

// Every row of the problem table, by error_code.
std::map<int, kstate::server::failure_info> problem_table() {
  std::map<int, kstate::server::failure_info> out;
  for (int r = static_cast<int>(failure_reason::unknown_store);
       r <= static_cast<int>(failure_reason::version_history_gone); ++r) {
    auto info = kstate::server::describe(static_cast<failure_reason>(r));
    out.emplace(info.error_code, info);
  }
  return out;
}

// Every object in `node` (references not followed) that has an "error_code" member,
// with the JSON pointer where it sits.
void collect_error_codes(const json& node, const std::string& where,
                         std::vector<std::pair<std::string, const json*>>& out) {
  if (node.is_object()) {
    if (node.contains("error_code")) out.emplace_back(where, &node);
    for (const auto& [k, v] : node.items()) collect_error_codes(v, where + "/" + k, out);
  } else if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i) collect_error_codes(node[i], where + "/" + std::to_string(i), out);
  }
}

}  // namespace

TEST_CASE("the spec is an OpenAPI 3.1 document of version 0.1.0") {
  CHECK(spec().at("openapi").get<std::string>().rfind("3.1.", 0) == 0);
  CHECK(spec().at("info").at("version") == "0.1.0");
}

TEST_CASE("the spec describes exactly the routes of the router") {
  std::set<std::string> router, documented;
  for (const auto& r : kstate::server::api_routes()) router.insert(name_of(r.method, r.path));
  for (const auto& o : spec_operations()) documented.insert(name_of(o.method, o.path));
  REQUIRE_FALSE(router.empty());

  for (const auto& r : router) CHECK_MESSAGE(documented.count(r), "route missing from docs/openapi.json: ", r);
  for (const auto& d : documented)
    CHECK_MESSAGE(router.count(d), "docs/openapi.json documents a route the router does not have: ", d);
}

TEST_CASE("every operation has an operationId and responses") {
  std::set<std::string> ids;
  for (const auto& o : spec_operations()) {
    INFO(name_of(o.method, o.path));
    REQUIRE(o.op->contains("operationId"));
    CHECK_MESSAGE(ids.insert(o.op->at("operationId").get<std::string>()).second, "duplicate operationId");
    REQUIRE(o.op->contains("responses"));
    CHECK_FALSE(o.op->at("responses").empty());
    // Every answer carries X-Request-Id.
    for (const auto& [status, r] : o.op->at("responses").items()) {
      INFO("response " << status);
      CHECK(resolve(r).contains("headers"));
      if (resolve(r).contains("headers")) CHECK(resolve(r).at("headers").contains("X-Request-Id"));
    }
  }
}

TEST_CASE("every path parameter of a template is declared, and only those") {
  for (const auto& o : spec_operations()) {
    INFO(name_of(o.method, o.path));
    const auto in_template = template_params(o.path);
    const auto declared = params_in(o, "path");
    CHECK_MESSAGE(in_template == declared, "template has {", join(in_template), "}, declared: ", join(declared));
    for (const auto& name : declared) {
      const json& p = *o.params.at({"path", name});
      CHECK_MESSAGE(p.value("required", false), "path parameter '", name, "' must be required");
    }
  }
}

TEST_CASE("each route's query parameters are the ones the spec declares") {
  std::map<std::string, const operation*> by_name;
  const auto ops = spec_operations();
  for (const auto& o : ops) by_name[name_of(o.method, o.path)] = &o;

  for (const auto& r : kstate::server::api_routes()) {
    const auto name = name_of(r.method, r.path);
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;  // reported by the route set test
    INFO(name);
    const std::set<std::string> allowed(r.params.begin(), r.params.end());
    const auto declared = params_in(*it->second, "query");
    CHECK_MESSAGE(allowed == declared, "query parameters the spec lacks: ", join(minus(allowed, declared)),
                  "; the spec declares but the router rejects: ", join(minus(declared, allowed)));
    // The header form of min_position exists exactly where min_position does.
    CHECK_MESSAGE(params_in(*it->second, "header").count("X-Kstate-Min-Position") == allowed.count("min_position"),
                  "X-Kstate-Min-Position must be declared iff min_position is");
  }
}

TEST_CASE("the Problem schema's error_code enum is the problem table") {
  const auto table = problem_table();
  REQUIRE(table.size() == static_cast<size_t>(failure_reason::version_history_gone) + 1);  // codes are unique
  const json& problem = resolve(spec().at("components").at("schemas").at("Problem"));
  std::set<int> in_spec;
  for (const auto& c : problem.at("properties").at("error_code").at("enum")) in_spec.insert(c.get<int>());
  for (const auto& [code, info] : table)
    CHECK_MESSAGE(in_spec.count(code), "error_code ", code, " (", info.title, ") missing from the Problem schema");
  for (int code : in_spec)
    CHECK_MESSAGE(table.count(code), "Problem schema lists error_code ", code, ", not in the problem table");
}

TEST_CASE("every error_code in the spec's examples matches the problem table") {
  const auto table = problem_table();
  std::vector<std::pair<std::string, const json*>> found;
  collect_error_codes(spec(), "", found);
  size_t examples = 0;
  for (const auto& [where, obj] : found) {
    INFO(where);
    const json& code = obj->at("error_code");
    if (code.is_object()) {  // a schema: its enum, if any, must hold table codes only
      for (const auto& c : code.value("enum", json::array()))
        CHECK_MESSAGE(table.count(c.get<int>()), "unknown error_code ", c.get<int>());
      continue;
    }
    ++examples;
    REQUIRE(code.is_number_integer());
    auto row = table.find(code.get<int>());
    REQUIRE_MESSAGE(row != table.end(), "unknown error_code ", code.get<int>());
    if (obj->contains("status")) CHECK(obj->at("status").get<unsigned>() == row->second.status);
    if (obj->contains("title")) CHECK(obj->at("title").get<std::string>() == row->second.title);
  }
  CHECK(examples >= table.size());  // each code has an example
}

TEST_CASE("problem examples sit under responses of their own status") {
  const auto table = problem_table();
  auto check_response = [&table](const std::string& where, const std::string& status, const json& response) {
    const json& r = resolve(response);
    if (!r.contains("content") || !r.at("content").contains("application/problem+json")) return;
    INFO(where << " " << status);
    const json& media = r.at("content").at("application/problem+json");
    CHECK_MESSAGE(media.contains("examples"), "a problem response lists its error codes as examples");
    // Held by name: items() of a temporary would dangle inside the loop.
    const json examples = media.value("examples", json::object());
    for (const auto& [name, ex] : examples.items()) {
      const int code = resolve(ex).at("value").at("error_code").get<int>();
      auto row = table.find(code);
      REQUIRE_MESSAGE(row != table.end(), "example ", name, " has an unknown error_code ", code);
      CHECK_MESSAGE(std::to_string(row->second.status) == status, "example ", name, " (", code, ") under status ",
                    status);
    }
  };
  for (const auto& o : spec_operations())
    for (const auto& [status, r] : o.op->at("responses").items()) check_response(name_of(o.method, o.path), status, r);
  const json responses = spec().at("components").value("responses", json::object());
  for (const auto& [name, r] : responses.items()) {
    const json content = r.value("content", json::object());
    if (!content.contains("application/problem+json")) continue;
    // A component response has no status of its own; the one of its examples must agree.
    std::set<unsigned> statuses;
    const json examples = content.at("application/problem+json").value("examples", json::object());
    for (const auto& [ex_name, ex] : examples.items())
      statuses.insert(resolve(ex).at("value").at("status").get<unsigned>());
    CHECK_MESSAGE(statuses.size() == 1, "components/responses/", name, " mixes statuses");
  }
}
