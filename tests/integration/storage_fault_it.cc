// Storage fault scenarios (docs/reliability.md, scenario 5): the state directory made
// read-only under a running instance, and files of its RocksDB database deleted, while
// records and lookups flow. Every answer given during a fault is checked against the
// acknowledged records (the value a key had at the position the answer claims), and the
// final state, before and after a restart, against the model: nothing lost, nothing
// applied twice.
//
// Needs root (bind mounts). KSTATE_FAULT_SCALE=long (scripts/chaos) runs the long
// versions; each scenario prints one summary line and appends it to
// $KSTATE_FAULT_REPORT when set.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "agg_common.h"
#include "fault_common.h"
#include "support.h"

using namespace kstate::testing;
using clock_type = std::chrono::steady_clock;

namespace {

// Makes `dir` read-only by mounting it over itself read-only. Files the instance opened
// for writing before keep taking writes (as with a file system that turned read-only,
// the next new file fails: a write-ahead log switch, a flush, a compaction).
struct read_only_dir {
  std::string dir;
  bool mounted = false;
  explicit read_only_dir(std::string d) : dir(std::move(d)) {}
  void on() {
    auto rc =
        std::system(("mount --bind '" + dir + "' '" + dir + "' && mount -o remount,ro,bind '" + dir + "'").c_str());
    REQUIRE_MESSAGE(rc == 0, "mounting " << dir << " read-only failed (this scenario needs root)");
    mounted = true;
  }
  // Lazily: files RocksDB opened for reading through the read-only mount meanwhile keep
  // it busy, and go on reading through it until they are closed.
  void off() {
    if (mounted) CHECK(std::system(("umount -l '" + dir + "'").c_str()) == 0);
    mounted = false;
  }
  ~read_only_dir() {
    if (mounted) (void)std::system(("umount -l '" + dir + "'").c_str());
  }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The database's files in `dir` whose names start with `prefix` or end with `suffix`.
std::vector<std::filesystem::path> db_files(const std::string& dir, const std::string& prefix,
                                            const std::string& suffix) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto n = e.path().filename().string();
    if (!e.is_regular_file()) continue;
    if ((!prefix.empty() && n.rfind(prefix, 0) == 0) ||
        (!suffix.empty() && n.size() > suffix.size() &&
         n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0))
      out.push_back(e.path());
  }
  return out;
}

// Entries of the quarantine directory (each one damaged database moved aside).
size_t quarantined(const std::string& state) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(state + "/quarantine", ec)) n += e.is_directory() ? 1 : 0;
  return n;
}

// Stops the load's producer however the case ends (a failed REQUIRE throws).
struct load_stopper {
  load& l;
  ~load_stopper() { l.finish(); }
};

const std::vector<kstate_process::view> table_and_count(const std::string& table_topic,
                                                        const std::string& count_topic) {
  return {{"t", table_topic}, {"c", count_topic, "json", "", "string", "kind: count, group_by: {json: acct}"}};
}

}  // namespace

TEST_CASE("read-only state directory: applying stops and says so, reads go on, ingest resumes when writable again") {
  const int keys = 2000;
  const int cycles = long_run() ? 4 : 1;
  tally t{"state directory read-only"};
  auto topic = unique_name("storage-ro");
  create_topic(topic, 2);
  auto dir = temp_dir("storage-ro");
  const std::string state = dir + "/state";
  // 1 MiB memtables: new files (a log switch, a flush) are needed soon.
  kstate_process ks(unique_name("storage-ro-app"), {{"t", topic}}, state, "rocksdb: {write_buffer_mb: 1}\n");
  ks.start();
  ks.wait_ready();

  record_log log;
  std::mt19937 rng(8);
  auto batch = [&](int n, int round) {
    std::vector<produced> recs;
    for (int i = 0; i < n; ++i) {
      produced r{"key-" + std::to_string(rng() % keys), std::nullopt};
      if (rng() % 20 != 0)
        r.value = R"({"round":)" + std::to_string(round) + R"(,"pad":")" + std::string(200, 'x') + "\"}";
      recs.push_back(std::move(r));
    }
    log.add(recs, produce_bytes(topic, recs));
  };
  int64_t total = 0;
  batch(4000, 0);
  total += 4000;
  for (int i = 0; i < 300 && ks.position_sum("t") < total; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(ks.position_sum("t") == total);

  reader r({ks.port()}, keys, "t");
  read_only_dir ro(state);
  std::string applied_note;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    ro.on();
    ++t.runs;
    // More records arrive: applying stops, says so, and nothing is applied while
    // read-only.
    const int64_t applied_while_ro = produce_until_stalled(
        ks,
        [&](int round) {
          batch(4000, cycle * 100 + round);
          total += 4000;
        },
        "Read-only file system", std::chrono::seconds(long_run() ? 60 : 3));
    CHECK(applied_while_ro < total);
    applied_note +=
        (applied_note.empty() ? "" : ", ") + std::to_string(applied_while_ro) + " of " + std::to_string(total);

    // Writable again: ingest resumes by itself and catches up.
    ro.off();
    wait_resumed(ks, total);
  }
  r.finish();
  // RocksDB 7.8 does not resume after failing to create a write-ahead log: the instance
  // reopened its state in the same process (counted in the summary).
  const auto reopened = occurrences(slurp(ks.log_path()), "restarting on the same configuration to reopen the state");

  check_answers(r.seen, log, t);
  auto model = log.model();
  check_final(ks.port(), "t", model, keys, t);
  // What was written survives a restart, and nothing was taken for damage.
  CHECK(ks.terminate() == 0);
  ks.start();
  ks.wait_ready();
  CHECK(ks.position_sum("t") == total);
  check_final(ks.port(), "t", model, keys, t);
  CHECK(quarantined(state) == 0);

  // Read-only at start: a clear error naming the cause, not a crash; nothing moved.
  CHECK(ks.terminate() == 0);
  ro.on();
  ks.start();
  CHECK(ks.wait_exit(std::chrono::seconds(60)) == 1);
  const auto text = slurp(ks.log_path());
  CHECK(text.find("refuses writes") != std::string::npos);
  CHECK(text.find("Read-only file system") != std::string::npos);
  ro.off();
  CHECK(quarantined(state) == 0);
  ks.start();
  ks.wait_ready();
  check_final(ks.port(), "t", model, keys, t);
  t.notes = "applied " + applied_note + " records before the directory was writable again, then " +
            std::to_string(reopened) + " reopen(s) in the same process, " + std::to_string(r.refused) +
            " lookups refused meanwhile";
  t.report();
  CHECK(ks.terminate() == 0);
}

namespace {

// One run: the file picked by `pick` is deleted under the running instance (which
// checks its files every 2 s) while a table and a count ingest and lookups run. It must
// notice within the bound, stop serving and rebuild, and end with the model's state.
void delete_under_running(const std::string& scenario, const std::string& prefix, const std::string& suffix) {
  const int keys = 2000;
  const int runs = long_run() ? 4 : 1;
  const auto detect_bound = std::chrono::seconds(20);
  tally t{scenario};
  auto table_topic = unique_name("storage-del"), count_topic = unique_name("storage-del-acct");
  create_topic(table_topic, 3);
  create_topic(count_topic, 3);
  auto dir = temp_dir("storage-del");
  const std::string state = dir + "/state";
  kstate_process ks(unique_name("storage-del-app"), table_and_count(table_topic, count_topic), state,
                    "rocksdb: {write_buffer_mb: 1, verify_files_interval_ms: 2000}\n");
  ks.start();
  ks.wait_ready();

  load l(table_topic, count_topic, keys);
  l.start(1000);
  load_stopper stop_load{l};
  reader r({ks.port()}, keys, "t");
  std::string notes;
  for (int run = 0; run < runs; ++run) {
    std::this_thread::sleep_for(std::chrono::seconds(long_run() ? 20 : 5));
    // No SST file yet (memtables not flushed): a clean restart flushes them.
    if (db_files(state, prefix, suffix).empty()) {
      CHECK(ks.terminate() == 0);
      ks.start();
      ks.wait_ready(std::chrono::seconds(300));
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    // A file of the kind asked for, as RocksDB keeps it now.
    std::filesystem::path victim;
    for (int i = 0; i < 300 && victim.empty(); ++i) {
      auto files = db_files(state, prefix, suffix);
      for (const auto& f : files)
        if (std::filesystem::remove(f)) {
          victim = f;
          break;
        }
      if (victim.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    REQUIRE_MESSAGE(!victim.empty(), "no " << prefix << "*" << suffix << " file in " << state);
    const auto deleted_at = clock_type::now();
    const size_t before =
        occurrences(slurp(ks.log_path()), "the state must be reopened (a file of the database was deleted");
    ++t.runs;
    bool noticed = false;
    while (!noticed && clock_type::now() - deleted_at < detect_bound + std::chrono::seconds(5)) {
      noticed =
          occurrences(slurp(ks.log_path()), "the state must be reopened (a file of the database was deleted") > before;
      if (!noticed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - deleted_at);
    REQUIRE_MESSAGE(noticed, victim.filename().string() << " deleted, not noticed; see " << ks.log_path());
    CHECK(took <= detect_bound);
    notes += (notes.empty() ? "" : ", ") + victim.filename().string() + " noticed in " + std::to_string(took.count()) +
             " ms";
    // The same process serves again (rebuilding, or reopened when RocksDB no longer
    // needed the file), the same pid.
    ks.wait_ready(std::chrono::seconds(300));
    CHECK(::kill(ks.pid(), 0) == 0);
  }
  l.finish();
  const auto total = static_cast<int64_t>(l.table_log.size());
  wait_caught_up(ks, total, l.accounts_total, std::chrono::seconds(300));
  r.finish();

  check_answers(r.seen, l.table_log, t);
  const auto model = l.table_log.model();
  check_final(ks.port(), "t", model, keys, t);
  check_counts(ks.port(), "c", l.per_account, t);
  // After a restart too.
  CHECK(ks.terminate() == 0);
  ks.start();
  ks.wait_ready();
  CHECK(ks.position_sum("t") == total);
  check_final(ks.port(), "t", model, keys, t);
  check_counts(ks.port(), "c", l.per_account, t);
  t.notes = notes + "; " + std::to_string(quarantined(state)) + " state(s) moved aside, " + std::to_string(total) +
            " table records, " + std::to_string(l.accounts_total) + " counted, " + std::to_string(r.refused) +
            " lookups refused during restarts";
  t.report();
  CHECK(ks.terminate() == 0);
}

// One run: the file picked is deleted while the instance is stopped. The next start
// must move the damaged state aside (kept, not deleted), rebuild every view from Kafka,
// and end with the model's state.
void delete_while_stopped(const std::string& scenario, const std::string& prefix, const std::string& suffix) {
  const int keys = 2000;
  const int runs = long_run() ? 3 : 1;
  tally t{scenario};
  auto table_topic = unique_name("storage-stop"), count_topic = unique_name("storage-stop-acct");
  create_topic(table_topic, 3);
  create_topic(count_topic, 3);
  auto dir = temp_dir("storage-stop");
  const std::string state = dir + "/state";
  kstate_process ks(unique_name("storage-stop-app"), table_and_count(table_topic, count_topic), state,
                    "rocksdb: {write_buffer_mb: 1}\n");
  ks.start();
  ks.wait_ready();
  load l(table_topic, count_topic, keys);
  l.start(1000);
  load_stopper stop_load{l};
  // Answers are checked once the load stopped (check_answers).
  std::vector<observation> seen;
  for (int run = 0; run < runs; ++run) {
    std::this_thread::sleep_for(std::chrono::seconds(long_run() ? 15 : 5));
    CHECK(ks.terminate() == 0);
    auto files = db_files(state, prefix, suffix);
    REQUIRE_MESSAGE(!files.empty(), "no " << prefix << "*" << suffix << " file in " << state);
    std::filesystem::remove(files.front());
    ++t.runs;
    ks.start();
    reader r({ks.port()}, keys, "t");
    ks.wait_ready(std::chrono::seconds(300));
    std::this_thread::sleep_for(std::chrono::seconds(2));
    r.finish();
    seen.insert(seen.end(), r.seen.begin(), r.seen.end());
    CHECK(quarantined(state) == static_cast<size_t>(run + 1));
  }
  l.finish();
  check_answers(seen, l.table_log, t);
  const auto total = static_cast<int64_t>(l.table_log.size());
  wait_caught_up(ks, total, l.accounts_total, std::chrono::seconds(300));
  const auto model = l.table_log.model();
  check_final(ks.port(), "t", model, keys, t);
  check_counts(ks.port(), "c", l.per_account, t);
  CHECK(occurrences(slurp(ks.log_path()), "is damaged and cannot be opened") == static_cast<size_t>(runs));
  // The damaged state is kept, not deleted.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(state + "/quarantine", ec))
    CHECK_FALSE(db_files(e.path().string(), "CURRENT", "").empty());
  CHECK(ks.terminate() == 0);
  ks.start();
  ks.wait_ready();
  check_final(ks.port(), "t", model, keys, t);
  check_counts(ks.port(), "c", l.per_account, t);
  t.notes = std::to_string(total) + " table records, " + std::to_string(l.accounts_total) + " counted, " +
            std::to_string(quarantined(state)) + " state(s) moved aside";
  t.report();
  CHECK(ks.terminate() == 0);
}

}  // namespace

TEST_CASE("an SST file deleted under a running instance: noticed within the bound, state rebuilt, nothing wrong") {
  delete_under_running("SST file deleted (running)", "", ".sst");
}

TEST_CASE("the write-ahead log deleted under a running instance: noticed within the bound, nothing lost") {
  delete_under_running("write-ahead log deleted (running)", "", ".log");
}

TEST_CASE("the MANIFEST deleted under a running instance: noticed within the bound, state rebuilt, nothing wrong") {
  delete_under_running("MANIFEST deleted (running)", "MANIFEST-", "");
}

TEST_CASE("an SST file deleted while stopped: the next start moves the state aside and rebuilds it") {
  delete_while_stopped("SST file deleted (stopped)", "", ".sst");
}

TEST_CASE("the MANIFEST deleted while stopped: the next start moves the state aside and rebuilds it") {
  delete_while_stopped("MANIFEST deleted (stopped)", "MANIFEST-", "");
}
