#pragma once
// Shared by the fault scenarios (fault_it, crash_it): the long/short switch and the
// summary line of docs/reliability.md's table.

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

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

}  // namespace kstate::testing
