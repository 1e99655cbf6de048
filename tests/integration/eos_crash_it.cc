// kill -9 at random moments while a word count and a sum are computed. Under
// exactly_once the final aggregates equal the recount exactly (0 lost, 0 doubled), and
// restarts catch up from the changelog tail, never from its beginning. The same
// schedule under at_least_once shows what the exact comparison would catch: counts
// never below the recount, and the double counting that a crash there can cause.
#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <regex>
#include <thread>

#include "agg_common.h"

using namespace kstate::testing;

namespace {

struct outcome {
  std::map<std::string, json> words, sums;
  int kills = 0;
  int64_t restored = 0;            // changelog records applied over all restarts
  int64_t restores_from_zero = 0;  // restores that started at changelog offset 0
  int64_t changelog_records = 0;
};

struct scenario {
  corpus lines;
  std::vector<produced> amounts;
  std::map<std::string, int64_t> sums;
  int64_t sum_total = 0;
};

scenario make_scenario() {
  scenario s;
  s.lines = make_corpus(30'000, 500, 5);
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> acct(0, 99), amount(1, 100);
  for (int i = 0; i < 30'000; ++i) {
    auto k = "acct-" + std::to_string(acct(rng));
    int a = amount(rng);
    s.amounts.push_back({k, std::to_string(a)});
    s.sums[k] += a;
    s.sum_total += a;
  }
  return s;
}

outcome run(const scenario& sc, const std::string& guarantee) {
  const int chunks = 10;
  auto lines = unique_name("eos-lines"), amounts = unique_name("eos-amounts");
  create_topic(lines, 4);
  create_topic(amounts, 4);
  auto app = unique_name("eos-" + guarantee);
  auto dir = temp_dir("eos");
  kstate_process ks(app,
                    {{"words", lines, "json", "", "string", "kind: count, group_by: words"},
                     {"sums", amounts, "json", "", "string", "kind: sum"}},
                    dir + "/state", "processing_guarantee: " + guarantee + "\n");
  // Static membership: a restarted instance takes its partitions back at once instead
  // of waiting for the killed member's session to expire.
  ks.extra_args({"-X", "group.instance.id=" + app + "-0"});

  std::atomic<int> produced_chunks{0};
  std::thread producer([&] {
    for (int c = 0; c < chunks; ++c) {
      auto slice = [&](const std::vector<produced>& all) {
        size_t n = all.size() / chunks;
        return std::vector<produced>(all.begin() + c * n, c == chunks - 1 ? all.end() : all.begin() + (c + 1) * n);
      };
      produce(lines, slice(sc.lines.records));
      produce(amounts, slice(sc.amounts));
      ++produced_chunks;
    }
  });

  outcome out;
  std::mt19937 rng(guarantee == "exactly_once" ? 1 : 2);
  std::uniform_int_distribution<int> delay_ms(100, 1500);
  while (produced_chunks < chunks || out.kills < 10) {
    ks.start();
    REQUIRE_MESSAGE(wait_assigned(ks, std::chrono::seconds(60)), "no assignment; see " << ks.log_path());
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ks.kill9();
    ++out.kills;
  }
  producer.join();
  // Everything is produced: two more kills while it catches up.
  std::uniform_int_distribution<int> short_delay(0, 400);
  for (int i = 0; i < 2; ++i) {
    ks.start();
    REQUIRE(wait_assigned(ks, std::chrono::seconds(60)));
    std::this_thread::sleep_for(std::chrono::milliseconds(short_delay(rng)));
    ks.kill9();
    ++out.kills;
  }

  ks.start();
  ks.wait_ready();
  wait_total(ks.port(), "words", sc.lines.words, std::chrono::seconds(120));
  wait_total(ks.port(), "sums", sc.sum_total, std::chrono::seconds(60));
  out.words = read_store(ks.port(), "words");
  out.sums = read_store(ks.port(), "sums");

  // What the restarts read from the changelogs, from the log of every run.
  std::ifstream log(ks.log_path());
  std::string line;
  static const std::regex restored_re(R"(restored (\d+) records of \S+ \(offsets (\d+)\.\.)");
  while (std::getline(log, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, restored_re)) continue;
    out.restored += std::stoll(m[1]);
    if (std::stoll(m[2]) == 0 && std::stoll(m[1]) > 0) ++out.restores_from_zero;
  }
  for (const auto& t : {app + "-words-changelog", app + "-sums-changelog"}) {
    std::istringstream offsets(kafka("get-offsets --topic " + t));
    while (std::getline(offsets, line)) out.changelog_records += std::stoll(line.substr(line.rfind(':') + 1));
  }
  CHECK(ks.terminate() == 0);
  return out;
}

// Keys whose value differs from the recount, and the total difference.
struct diff {
  size_t lower = 0, higher = 0, missing = 0, extra = 0;
  int64_t over = 0;
};
diff compare(const std::map<std::string, json>& got, const std::map<std::string, int64_t>& want) {
  diff d;
  for (const auto& [k, n] : want) {
    auto it = got.find(k);
    if (it == got.end()) {
      ++d.missing;
      continue;
    }
    auto v = it->second.get<int64_t>();
    if (v < n) ++d.lower;
    if (v > n) {
      ++d.higher;
      d.over += v - n;
    }
  }
  for (const auto& [k, v] : got)
    if (!want.count(k)) ++d.extra;
  return d;
}

}  // namespace

TEST_CASE("exactly_once: kill -9 at least 10 times during a word count and a sum; final values equal the recount") {
  auto sc = make_scenario();
  auto out = run(sc, "exactly_once");
  MESSAGE("exactly_once: " << out.kills << " kills; restarts applied " << out.restored << " changelog records of "
                           << out.changelog_records << " (" << out.restores_from_zero << " restores from offset 0)");
  CHECK(out.kills >= 10);
  auto w = compare(out.words, sc.lines.counts);
  auto s = compare(out.sums, sc.sums);
  CHECK(w.missing == 0);
  CHECK(w.lower == 0);
  CHECK(w.higher == 0);
  CHECK(w.extra == 0);
  CHECK(s.missing == 0);
  CHECK(s.lower == 0);
  CHECK(s.higher == 0);
  CHECK(s.extra == 0);
  // Restarts catch up from the local changelog position, not from the beginning: the
  // only restore from offset 0 can be one after a kill before the first batch was
  // written locally.
  CHECK(out.restored < out.changelog_records / 2);
}

TEST_CASE("at_least_once under the same kills: nothing lost; double counting reported") {
  auto sc = make_scenario();
  auto out = run(sc, "at_least_once");
  CHECK(out.kills >= 10);
  auto w = compare(out.words, sc.lines.counts);
  auto s = compare(out.sums, sc.sums);
  // At least once: never below the recount.
  CHECK(w.missing == 0);
  CHECK(w.lower == 0);
  CHECK(s.missing == 0);
  CHECK(s.lower == 0);
  // The exact comparison used for exactly_once above sees any doubling here.
  MESSAGE("at_least_once: " << out.kills << " kills; words over-counted by " << w.over << " in " << w.higher << " of "
                            << sc.lines.counts.size() << " words; sums over by " << s.over << " in " << s.higher
                            << " of " << sc.sums.size() << " accounts");
}
