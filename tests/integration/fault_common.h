#pragma once
// Shared by the fault scenarios (fault_it, crash_it, partition_it): the long/short
// switch, the summary line of docs/reliability.md's table, and the checks of answers
// given during a fault against the acknowledged records.

#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
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

// An answer as seen during a fault: a lookup of `key`, or (limit > 0) a range page of
// at most `limit` keys from `key` on.
struct observation {
  std::string key;
  int status = 0;
  json body;
  int limit = 0;
};

struct reader_options {
  std::string query;  // parameters added to every request (e.g. "allow_stale=true")
  // Like a client behind a load balancer with health checks: only to the instances
  // whose /readyz answered 200 when last asked (every 250 ms).
  bool ready_only = false;
  int range_every = 0;  // every Nth request a range page of 20 keys (0: lookups only)
  int threads = 1;      // clients sending at once, each waiting `pause` between requests
  std::chrono::milliseconds pause{2};
};

// Sends random lookups (and range pages) to the instances at `at` until `finish()`,
// keeping every answer.
class reader {
 public:
  reader(int keys, const std::string& store, std::vector<http_address> at, reader_options o = {})
      : at_(std::move(at)), keys_(keys), store_(store), o_(std::move(o)), ready_(at_.size()) {
    for (auto& r : ready_) r = !o_.ready_only;
    if (o_.ready_only) health_ = std::thread([this] { check_health(); });
    per_thread_.resize(static_cast<size_t>(std::max(1, o_.threads)));
    for (size_t i = 0; i < per_thread_.size(); ++i) threads_.emplace_back([this, i] { run(i); });
  }
  // Instances on loopback.
  reader(const std::vector<uint16_t>& ports, int keys, const std::string& store, reader_options o = {})
      : reader(keys, store, on_loopback(ports), std::move(o)) {}
  ~reader() { finish(); }
  void finish() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    if (health_.joinable()) health_.join();
    for (auto& part : per_thread_) {
      seen.insert(seen.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
      part.clear();
    }
  }
  std::vector<observation> seen;    // complete after finish()
  std::atomic<int64_t> refused{0};  // no connection (the instance restarting)

 private:
  void run(size_t index) {
    std::mt19937 rng(3 + static_cast<unsigned>(index));
    auto& out = per_thread_[index];
    std::vector<std::unique_ptr<http_client>> clients;
    for (const auto& a : at_) clients.push_back(std::make_unique<http_client>(a.host, a.port));
    std::vector<size_t> up;
    for (int64_t n = 1; !stop_; ++n) {
      up.clear();
      for (size_t i = 0; i < ready_.size(); ++i)
        if (ready_[i]) up.push_back(i);
      if (up.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      observation o{"key-" + std::to_string(rng() % keys_)};
      std::string target = "/v1/stores/" + store_ + "/keys";
      if (o_.range_every > 0 && n % o_.range_every == 0) {
        o.limit = 20;
        target += "?from=" + o.key + "&limit=" + std::to_string(o.limit) + (o_.query.empty() ? "" : "&" + o_.query);
      } else {
        target += "/" + o.key + (o_.query.empty() ? "" : "?" + o_.query);
      }
      auto a = clients[up[rng() % up.size()]]->get(target);
      if (!a) {
        ++refused;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      o.status = a->status;
      if (!a->body.empty()) o.body = json::parse(a->body, nullptr, false);
      out.push_back(std::move(o));
      if (o_.pause.count() > 0) std::this_thread::sleep_for(o_.pause);
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
  std::string store_;
  reader_options o_;
  std::vector<std::atomic<bool>> ready_;
  std::atomic<bool> stop_{false};
  std::vector<std::vector<observation>> per_thread_;
  std::vector<std::thread> threads_;
  std::thread health_;
};

// A lookup answer against the acknowledged records: a 200 names the record that wrote
// its value (this key, this value) and no later record of the key below its position;
// a 404 has no live record of the key below its position.
inline bool lookup_correct(const observation& o, record_log& log) {
  if (o.status != 200 && o.status != 404) return false;
  const auto& b = o.body;
  if (!b.is_object() || !b.contains("partition") || !b.contains("position")) return false;
  const int32_t p = b["partition"].get<int32_t>();
  const auto pos = b["position"].value(std::to_string(p), json());
  if (!pos.is_number_integer()) return false;
  auto latest = log.latest_below(o.key, p, pos.get<int64_t>());
  if (o.status == 404) return !latest || !log.at.at({p, *latest}).value;
  const int64_t off = b.value("offset", int64_t{-1});
  auto it = log.at.find({p, off});
  return latest && *latest == off && it != log.at.end() && it->second.key == o.key && it->second.value &&
         json::parse(*it->second.value) == b["value"];
}

// A range page against the acknowledged records, at the position per partition it
// claims: its entries are in key order from the first key asked, each the latest record
// of its key below that position, and none is missing: every key of the log from the
// first key asked up to the last one returned (to the end when the page is not full)
// whose latest record below the position is a value.
inline bool range_correct(const observation& o, record_log& log) {
  if (o.status != 200 || !o.body.is_object() || !o.body.contains("data") || !o.body["data"].is_array()) return false;
  const auto& data = o.body["data"];
  const json position = o.body.contains("metadata") ? o.body["metadata"].value("position", json()) : json();
  if (!position.is_object() || data.size() > static_cast<size_t>(o.limit)) return false;
  auto position_of = [&](int32_t p) -> std::optional<int64_t> {
    auto v = position.value(std::to_string(p), json());
    if (!v.is_number_integer()) return std::nullopt;
    return v.get<int64_t>();
  };
  std::set<std::string> returned;
  std::string previous;
  for (const auto& e : data) {
    const auto key = e.value("key", "");
    if (key < o.key || (!returned.empty() && key <= previous)) return false;
    previous = key;
    returned.insert(key);
    const int32_t p = e.value("partition", -1);
    const int64_t off = e.value("offset", int64_t{-1});
    auto pos = position_of(p);
    if (!pos) return false;
    auto latest = log.latest_below(key, p, *pos);
    auto it = log.at.find({p, off});
    if (!latest || *latest != off || it == log.at.end() || it->second.key != key || !it->second.value ||
        json::parse(*it->second.value) != e["value"])
      return false;
  }
  const bool full = data.size() == static_cast<size_t>(o.limit);
  for (auto k = log.offsets_of.lower_bound(o.key); k != log.offsets_of.end() && (!full || k->first <= previous); ++k) {
    for (const auto& [p, offsets] : k->second) {
      auto pos = position_of(p);
      if (!pos) return false;
      auto latest = log.latest_below(k->first, p, *pos);
      if (latest && log.at.at({p, *latest}).value && !returned.count(k->first)) return false;
    }
  }
  return true;
}

// Checks each answer against the acknowledged records (lookup_correct, range_correct);
// 503s are counted.
// Each answer is judged by every record below the position it claims, so only against a
// complete log: once the records' producer stopped. A batch is in Kafka, and may be in
// answers, before its produce returns and it is added to the log; an answer from such a
// batch checked before then looks wrong.
inline void check_answers(const std::vector<observation>& seen, record_log& log, tally& t) {
  std::lock_guard lock(log.mu);
  for (const auto& o : seen) {
    if (o.status == 503) {
      ++t.unavailable;
      continue;
    }
    ++t.checked;
    if (!(o.limit > 0 ? range_correct(o, log) : lookup_correct(o, log))) {
      ++t.wrong;
      if (t.wrong <= 5)
        MESSAGE("wrong answer for " << std::string(o.limit > 0 ? "the range from " : "") << o.key << ": " << o.status
                                    << " " << o.body.dump().substr(0, 600));
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

// Waits until the group over `nodes` has settled (every instance ready, every one of
// `partitions` held once, each instance's view naming the same holders) and, with
// `table_records`, their table view "t" has applied that many records between them.
inline void wait_settled(const std::vector<kstate_process*>& nodes, int partitions, std::chrono::seconds timeout,
                         std::optional<int64_t> table_records = std::nullopt) {
  std::vector<http_address> at;
  std::string logs;
  for (auto* n : nodes) {
    at.push_back({n->host(), n->port()});
    logs += (logs.empty() ? "" : ", ") + n->log_path();
  }
  std::string why;
  bool settled = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!settled && std::chrono::steady_clock::now() < deadline) {
    settled = group_settled(at, partitions, &why);
    if (settled && table_records) {
      int64_t applied = 0;
      for (auto* n : nodes) applied += std::max<int64_t>(0, n->position_sum("t"));
      if (applied != *table_records) {
        settled = false;
        why = "applied " + std::to_string(applied) + " of " + std::to_string(*table_records) + " records";
      }
    }
    if (!settled) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE_MESSAGE(settled, "the group did not settle: " << why << "; see " << logs);
}

// A state directory that refuses writes (full, read-only) while records keep coming:
// calls `produce(round)` (rounds 1, 2, ...) until the instance reports a stalled write,
// checks how it says so (the metrics, /readyz 503 naming `cause`, /livez 200), then
// that the process lives and applies nothing for `hold`. Returns the records of table
// view `store` applied.
inline int64_t produce_until_stalled(kstate_process& ks, const std::function<void(int)>& produce,
                                     const std::string& cause, std::chrono::seconds hold,
                                     const std::string& store = "t") {
  // Until a write fails: space RocksDB reserved earlier (its log's preallocation, a log
  // file open before) takes the first records.
  bool stalled = false;
  int round = 1;
  for (; round <= 20 && !stalled; ++round) {
    produce(round);
    for (int i = 0; i < 50 && !stalled; ++i) {
      stalled = ks.metric_sum("kstate_ingest_write_stalled") == 1;
      if (!stalled) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  REQUIRE_MESSAGE(stalled, "no write failure reported; see " << ks.log_path());
  // One more round, arriving while stalled. The write that failed first may have been
  // another view's or a later one, after every record so far was applied; none of
  // these may be applied until the directory takes writes again.
  produce(round);
  // Counted since the instance last reopened its state (a reopen starts the metrics
  // again, as a restart does).
  CHECK(ks.metric_sum("kstate_ingest_write_failures_total") >= 1);
  http_client c(ks.host(), ks.port());
  auto ready = c.get("/readyz");
  REQUIRE(ready);
  CHECK(ready->status == 503);
  CHECK_MESSAGE(ready->body_json().value("write_failure", "").find(cause) != std::string::npos, ready->body);
  auto live = c.get("/livez");
  REQUIRE(live);
  CHECK(live->status == 200);
  const int64_t applied = ks.position_sum(store);
  std::this_thread::sleep_for(hold);
  CHECK(::kill(ks.pid(), 0) == 0);
  CHECK(ks.position_sum(store) == applied);
  return applied;
}

// After produce_until_stalled, once the directory takes writes again: ingest resumes by
// itself and table view `store` reaches `total` records; the instance is ready again.
inline void wait_resumed(kstate_process& ks, int64_t total, const std::string& store = "t") {
  for (int i = 0; i < 600 && ks.position_sum(store) < total; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(ks.position_sum(store) == total, "ingest did not resume; see " << ks.log_path());
  CHECK(ks.metric_sum("kstate_ingest_write_stalled") == 0);
  ks.wait_ready(std::chrono::seconds(30));
}

}  // namespace kstate::testing
