#pragma once
// Shared by the aggregate integration tests: a generated corpus with a known word
// distribution, its recount, and reading aggregates back over HTTP.

#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support.h"

namespace kstate::testing {

// `lines` lines of 1..12 words from a vocabulary of `vocabulary` words picked with a
// skewed (Zipf-like) distribution, in mixed case with punctuation between words. The
// recount is kept as the lines are made: the word as chosen, lower-cased, +1. It does
// not use kstate's word splitting.
struct corpus {
  std::vector<produced> records;
  std::map<std::string, int64_t> counts;
  int64_t words = 0;
};

inline std::string vocab_word(int i) {
  // Letters only, so the recount's lower-casing is plain ASCII.
  std::string w;
  int n = i;
  do {
    w += static_cast<char>('a' + n % 26);
    n /= 26;
  } while (n > 0);
  return "w" + w + (i % 3 == 0 ? "x" : "");  // e.g. "wa", "wbx"
}

inline corpus make_corpus(int lines, int vocabulary, uint32_t seed) {
  corpus c;
  std::mt19937 rng(seed);
  std::vector<double> weights;
  for (int i = 0; i < vocabulary; ++i) weights.push_back(1.0 / (i + 1));
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  std::uniform_int_distribution<int> len(1, 12), upper(0, 3), sep(0, 4);
  static const char* seps[] = {" ", ", ", " - ", "! ", "  "};
  c.records.reserve(lines);
  for (int l = 0; l < lines; ++l) {
    std::string line;
    int n = len(rng);
    for (int k = 0; k < n; ++k) {
      auto w = vocab_word(pick(rng));
      ++c.counts[w];
      ++c.words;
      if (upper(rng) == 0) w[0] = static_cast<char>(std::toupper(w[0]));
      if (upper(rng) == 1)
        for (auto& ch : w) ch = static_cast<char>(std::toupper(ch));
      if (k) line += seps[sep(rng)];
      line += w;
    }
    if (sep(rng) == 0) line += ".";
    c.records.push_back({std::nullopt, line});
  }
  return c;
}

// Every key and value of a store, read with paginated ranges from one instance (on
// `host`, 127.0.0.1 when not given).
inline std::map<std::string, json> read_store(const std::string& host, uint16_t port, const std::string& store) {
  std::map<std::string, json> out;
  http_client c(host, port);
  std::string cursor;
  for (;;) {
    auto a = c.get("/v1/stores/" + store + "/keys?limit=1000" + (cursor.empty() ? "" : "&cursor=" + pct(cursor)));
    if (!a || a->status != 200) return {};
    auto body = a->body_json();
    for (const auto& e : body["data"]) out[e["key"].get<std::string>()] = e["value"];
    if (body["metadata"]["next"].is_null()) break;
    cursor = body["metadata"]["next"].get<std::string>();
  }
  return out;
}

inline std::map<std::string, json> read_store(uint16_t port, const std::string& store) {
  return read_store("127.0.0.1", port, store);
}

// Sum of a store's numeric values (whole store over HTTP); -1 when unavailable.
inline int64_t store_total(const std::string& host, uint16_t port, const std::string& store) {
  auto all = read_store(host, port, store);
  if (all.empty()) return -1;
  int64_t sum = 0;
  for (const auto& [k, v] : all)
    if (v.is_number_integer()) sum += v.get<int64_t>();
  return sum;
}

inline int64_t store_total(uint16_t port, const std::string& store) { return store_total("127.0.0.1", port, store); }

// Waits until the store's values add up to at least `expected` (or the deadline).
// Exactness is asserted by the caller, key by key: this only waits for the end.
inline int64_t wait_total(const std::string& host, uint16_t port, const std::string& store, int64_t expected,
                          std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int64_t got = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    got = store_total(host, port, store);
    if (got >= expected) {
      // Settle: a further batch in flight would still show up here.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      return store_total(host, port, store);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return got;
}
inline int64_t wait_total(uint16_t port, const std::string& store, int64_t expected, std::chrono::seconds timeout) {
  return wait_total("127.0.0.1", port, store, expected, timeout);
}

// Sum of the series of a metric whose labels contain `label` (e.g. topic="x").
inline double metric_with(uint16_t port, const std::string& name, const std::string& label) {
  http_client c(port);
  auto a = c.get("/metrics");
  if (!a || a->status != 200) return -1;
  std::istringstream in(a->body);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0) continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// Waits until the process has been assigned partitions (it may still be restoring).
inline bool wait_assigned(kstate_process& ks, std::chrono::seconds timeout) {
  http_client c(ks.port());
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto a = c.get("/readyz");
    if (a && !a->body_json()["partitions"].empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace kstate::testing
