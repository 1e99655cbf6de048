#pragma once
// Shared by the fault scenarios (fault_it, crash_it, partition_it): the long/short
// switch, the summary line of docs/reliability.md's table, and the checks of answers
// given during a fault against the acknowledged records.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "agg_common.h"
#include "support.h"

namespace kstate::testing {

// KSTATE_FAULT_SCALE=long (scripts/chaos): the long version of each scenario.
inline bool long_run() {
  const char* s = std::getenv("KSTATE_FAULT_SCALE");
  return s != nullptr && std::string(s) == "long";
}

// One line of the fault table: `scenario | runs | answers checked | wrong | lost |
// duplicated | 503s | result`.
struct tally {
  std::string scenario;
  int runs = 0;  // faults injected
  int64_t checked = 0, wrong = 0, lost = 0, duplicated = 0, unavailable = 0;
  std::string notes;

  void report() const {
    const bool pass = wrong == 0 && lost == 0 && duplicated == 0;
    std::string line = scenario + " | " + std::to_string(runs) + " | " + std::to_string(checked) + " | " +
                       std::to_string(wrong) + " | " + std::to_string(lost) + " | " + std::to_string(duplicated) +
                       " | " + std::to_string(unavailable) + " | " + (pass ? "pass" : "FAIL") +
                       (notes.empty() ? "" : " (" + notes + ")");
    MESSAGE(line);
    if (const char* file = std::getenv("KSTATE_FAULT_REPORT")) std::ofstream(file, std::ios::app) << line << "\n";
    CHECK(wrong == 0);
    CHECK(lost == 0);
    CHECK(duplicated == 0);
  }
};

// The acknowledged records of one topic, by partition and offset.
struct record_log {
  struct rec {
    std::string key;
    std::optional<std::string> value;
  };
  std::mutex mu;
  std::map<std::pair<int32_t, int64_t>, rec> at;
  // Per key and partition, the offsets that wrote it, ascending.
  std::map<std::string, std::map<int32_t, std::vector<int64_t>>> offsets_of;

  void add(const std::vector<produced>& batch, const std::vector<std::pair<int32_t, int64_t>>& where) {
    std::lock_guard lock(mu);
    for (size_t i = 0; i < batch.size(); ++i) {
      at[where[i]] = {*batch[i].key, batch[i].value};
      auto& v = offsets_of[*batch[i].key][where[i].first];
      v.insert(std::upper_bound(v.begin(), v.end(), where[i].second), where[i].second);
    }
  }
  size_t size() {
    std::lock_guard lock(mu);
    return at.size();
  }
  // The record of `key` in `partition` that a store at `position` (the next offset to
  // apply) reflects: the last one below it, if any.
  std::optional<int64_t> latest_below(const std::string& key, int32_t partition, int64_t position) {
    auto k = offsets_of.find(key);
    if (k == offsets_of.end()) return std::nullopt;
    auto p = k->second.find(partition);
    if (p == k->second.end()) return std::nullopt;
    auto it = std::lower_bound(p->second.begin(), p->second.end(), position);
    if (it == p->second.begin()) return std::nullopt;
    return *std::prev(it);
  }
  table_model model() {
    std::lock_guard lock(mu);
    table_model m;
    // Per partition in offset order (map order), which is each key's order.
    for (const auto& [where, r] : at) {
      if (r.value) m[r.key] = *r.value;
      else m.erase(r.key);
    }
    return m;
  }
};

// A lookup answer as seen during a fault.
struct observation {
  std::string key;
  int status = 0;
  json body;
};

// Looks up random keys on the instances at `at` in a loop until `stop`, keeping every
// answer. `query` is appended to each lookup's path (e.g. "?allow_stale=true"). With
// `ready_only`, like a client behind a load balancer with health checks: only on the
// instances whose /readyz answered 200 when last asked (every 250 ms).
class reader {
 public:
  reader(int keys, const std::string& store, std::vector<http_address> at, std::string query = {},
         bool ready_only = false)
      : at_(std::move(at)), keys_(keys), query_(std::move(query)), ready_(at_.size()) {
    for (auto& r : ready_) r = !ready_only;
    if (ready_only) health_ = std::thread([this] { check_health(); });
    thread_ = std::thread([this, store] { run(store); });
  }
  // Instances on loopback.
  reader(const std::vector<uint16_t>& ports, int keys, const std::string& store, std::string query = {},
         bool ready_only = false)
      : reader(keys, store, on_loopback(ports), std::move(query), ready_only) {}
  ~reader() { finish(); }
  void finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (health_.joinable()) health_.join();
  }
  std::vector<observation> seen;
  int64_t refused = 0;  // no connection (the instance restarting)

 private:
  void run(const std::string& store) {
    std::mt19937 rng(3);
    std::vector<std::unique_ptr<http_client>> clients;
    for (const auto& a : at_) clients.push_back(std::make_unique<http_client>(a.host, a.port));
    std::vector<size_t> up;
    while (!stop_) {
      up.clear();
      for (size_t i = 0; i < ready_.size(); ++i)
        if (ready_[i]) up.push_back(i);
      if (up.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      auto key = "key-" + std::to_string(rng() % keys_);
      auto& c = *clients[up[rng() % up.size()]];
      auto a = c.get("/v1/stores/" + store + "/keys/" + key + query_);
      if (!a) {
        ++refused;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      observation o{key, a->status, {}};
      if (!a->body.empty()) o.body = json::parse(a->body, nullptr, false);
      seen.push_back(std::move(o));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  void check_health() {
    std::vector<std::unique_ptr<http_client>> clients;
    for (const auto& a : at_) clients.push_back(std::make_unique<http_client>(a.host, a.port));
    while (!stop_) {
      for (size_t i = 0; i < clients.size(); ++i) {
        auto a = clients[i]->get("/readyz");
        ready_[i] = a && a->status == 200;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }
  static std::vector<http_address> on_loopback(const std::vector<uint16_t>& ports) {
    std::vector<http_address> at;
    for (auto p : ports) at.push_back({"127.0.0.1", p});
    return at;
  }
  std::vector<http_address> at_;
  int keys_;
  std::string query_;
  std::vector<std::atomic<bool>> ready_;
  std::atomic<bool> stop_{false};
  std::thread thread_, health_;
};

// Checks each answer against the acknowledged records: a 200 names the record that wrote
// its value (this key, this value) and no later record of the key below its position;
// a 404 has no live record of the key below its position. 503s are counted.
inline void check_answers(const std::vector<observation>& seen, record_log& log, tally& t) {
  for (const auto& o : seen) {
    if (o.status == 503) {
      ++t.unavailable;
      continue;
    }
    ++t.checked;
    bool ok = false;
    if (o.status == 200 || o.status == 404) {
      const auto& b = o.body;
      if (b.is_object() && b.contains("partition") && b.contains("position")) {
        const int32_t p = b["partition"].get<int32_t>();
        const auto pos_field = b["position"].value(std::to_string(p), json());
        if (pos_field.is_number_integer()) {
          const int64_t pos = pos_field.get<int64_t>();
          auto latest = log.latest_below(o.key, p, pos);
          if (o.status == 200) {
            const int64_t off = b.value("offset", int64_t{-1});
            auto it = log.at.find({p, off});
            ok = latest && *latest == off && it != log.at.end() && it->second.key == o.key && it->second.value &&
                 json::parse(*it->second.value) == b["value"];
          } else {
            ok = !latest || !log.at.at({p, *latest}).value;
          }
        }
      }
    }
    if (!ok) {
      ++t.wrong;
      if (t.wrong <= 5) MESSAGE("wrong answer for " << o.key << ": " << o.status << " " << o.body.dump());
    }
  }
}

// Every key of the model read once more at the end: a missing or different value is an
// acknowledged update lost.
inline void check_final(const std::string& host, uint16_t port, const std::string& store, const table_model& model,
                        int keys, tally& t) {
  http_client c(host, port);
  for (int k = 0; k < keys; ++k) {
    auto key = "key-" + std::to_string(k);
    auto a = c.get("/v1/stores/" + store + "/keys/" + key);
    REQUIRE(a);
    ++t.checked;
    auto it = model.find(key);
    const bool ok =
        it == model.end() ? a->status == 404 : a->status == 200 && a->body_json()["value"] == json::parse(it->second);
    if (!ok) {
      ++t.lost;
      if (t.lost <= 5) MESSAGE("final answer for " << key << ": " << a->status << " " << a->body);
    }
  }
}

inline void check_final(uint16_t port, const std::string& store, const table_model& model, int keys, tally& t) {
  check_final("127.0.0.1", port, store, model, keys, t);
}

// Counts per account against the recount: below it is lost, above it counted twice.
inline void check_counts(const std::string& host, uint16_t port, const std::string& store,
                         const std::map<std::string, int64_t>& want, tally& t) {
  auto got = read_store(host, port, store);
  for (const auto& [k, n] : want) {
    ++t.checked;
    auto it = got.find(k);
    const int64_t v = it == got.end() ? 0 : it->second.get<int64_t>();
    if (v < n) t.lost += n - v;
    if (v > n) t.duplicated += v - n;
  }
  for (const auto& [k, v] : got)
    if (!want.count(k)) t.duplicated += v.get<int64_t>();
}
inline void check_counts(uint16_t port, const std::string& store, const std::map<std::string, int64_t>& want,
                         tally& t) {
  check_counts("127.0.0.1", port, store, want, t);
}

// A producer of table updates (key-N, 5% deletions) and of account records for the
// count, in batches through the idempotent Java producer, until told to stop.
struct load {
  std::string table_topic, count_topic;
  int keys;
  record_log table_log;
  std::mutex mu;
  std::map<std::string, int64_t> per_account;
  int64_t accounts_total = 0;
  std::atomic<bool> stop{false};
  std::atomic<int> batches{0};
  std::thread thread;

  load(std::string t, std::string c, int k) : table_topic(std::move(t)), count_topic(std::move(c)), keys(k) {}
  // A case that ends early (a failed REQUIRE) stops the producer too.
  ~load() { finish(); }
  void start(int batch_size) {
    thread = std::thread([this, batch_size] {
      std::mt19937 rng(21);
      for (int64_t n = 0; !stop; ++batches) {
        std::vector<produced> updates, accounts;
        std::map<std::string, int64_t> counted;
        for (int i = 0; i < batch_size; ++i, ++n) {
          produced r{"key-" + std::to_string(rng() % keys), std::nullopt};
          if (rng() % 20 != 0) r.value = R"({"seq":)" + std::to_string(n) + "}";
          updates.push_back(std::move(r));
          auto acct = "acct-" + std::to_string(rng() % 200);
          accounts.push_back({std::to_string(n), R"({"acct":")" + acct + R"(","n":)" + std::to_string(n) + "}"});
          ++counted[acct];
        }
        auto where = produce_bytes(table_topic, updates);
        table_log.add(updates, where);
        produce_bytes(count_topic, accounts);
        std::lock_guard lock(mu);
        for (const auto& [a, c] : counted) per_account[a] += c;
        accounts_total += batch_size;
      }
    });
  }
  void finish() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
};

// Waits until the instance's table has applied `records` and its count has counted
// `accounts`.
inline void wait_caught_up(kstate_process& ks, int64_t records, int64_t accounts, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (ks.position_sum("t") < records && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE_MESSAGE(ks.position_sum("t") == records, "the table did not catch up; see " << ks.log_path());
  const auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline - std::chrono::steady_clock::now());
  CHECK_MESSAGE(wait_total(ks.host(), ks.port(), "c", accounts, std::max(left, std::chrono::seconds(10))) == accounts,
                "the count did not catch up; see " << ks.log_path());
}

}  // namespace kstate::testing
