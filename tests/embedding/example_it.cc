// The installed package as an application uses it: `cmake --install` into a fresh
// prefix, examples/embedded configured and built there as a separate CMake project
// (find_package(kstate)), then run against the real broker and its answers compared
// with a recount of the orders produced.

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>

#include "support.h"

namespace t = kstate::testing;
namespace fs = std::filesystem;

namespace {

// A child process with its standard input and output as pipes.
class child {
 public:
  explicit child(const std::vector<std::string>& argv) {
    int in[2], out[2];
    REQUIRE(::pipe(in) == 0);
    REQUIRE(::pipe(out) == 0);
    std::fflush(nullptr);  // or the child would write the parent's buffered output again
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::close(in[1]);
      ::close(out[0]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = ::fdopen(in[1], "w");
    from_ = ::fdopen(out[0], "r");
  }
  ~child() {
    if (to_) std::fclose(to_);
    if (from_) std::fclose(from_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  void send(const std::string& line) {
    std::fputs((line + "\n").c_str(), to_);
    std::fflush(to_);
  }
  // The next line, without its newline; nullopt at end of output.
  std::optional<std::string> line() {
    std::string s;
    int c;
    while ((c = std::fgetc(from_)) != EOF && c != '\n') s += static_cast<char>(c);
    if (c == EOF && s.empty()) return std::nullopt;
    return s;
  }
  // Closes standard input and waits for the exit status.
  int finish() {
    std::fclose(to_);
    to_ = nullptr;
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

std::string customer_of(int i) { return "cust" + std::to_string(i % 6); }

}  // namespace

TEST_CASE("the installed package builds the example, whose answers match a recount of the orders") {
  const auto work = t::temp_dir("embed-example");
  const auto prefix = work + "/prefix";
  t::sh("cmake --install " + std::string(KSTATE_BUILD_DIR) + " --prefix " + prefix + " >/dev/null");

  // Only the public headers are installed.
  std::vector<std::string> headers;
  for (const auto& e : fs::recursive_directory_iterator(prefix + "/include"))
    if (e.is_regular_file()) headers.push_back(fs::relative(e.path(), prefix + "/include").string());
  std::sort(headers.begin(), headers.end());
  CHECK(headers == std::vector<std::string>{"kstate/kstate.h", "kstate/version.h"});
  // pkg-config finds the prefix the package was installed to.
  auto cflags = t::sh("PKG_CONFIG_PATH=" + prefix + "/lib/pkgconfig pkg-config --cflags kstate");
  CHECK(cflags.find("/include") != std::string::npos);
  CHECK(fs::equivalent(cflags.substr(2, cflags.find_first_of(" \n") - 2), prefix + "/include"));

  // The same program built with nothing but pkg-config's flags links, and runs (its
  // usage line, exit code 2, without arguments).
  const auto pc_binary = work + "/order_service_pc";
  t::sh("PKG_CONFIG_PATH=" + prefix + "/lib/pkgconfig ccache c++ -std=c++20 -O1 " + std::string(KSTATE_SOURCE_DIR) +
        "/examples/embedded/order_service.cc -o " + pc_binary + " $(PKG_CONFIG_PATH=" + prefix +
        "/lib/pkgconfig pkg-config --cflags --libs kstate)");
  CHECK(WEXITSTATUS(std::system((pc_binary + " 2>/dev/null").c_str())) == 2);

  // A separate project: only the prefix is given, never kstate's source or build tree.
  const auto build = work + "/build";
  t::sh("cmake -S " + std::string(KSTATE_SOURCE_DIR) + "/examples/embedded -B " + build +
        " -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=" + prefix +
        " -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null && ninja -C " + build + " >/dev/null");

  const auto topic = t::unique_name("example-orders");
  t::create_topic(topic, 3);
  constexpr int n = 50;
  std::vector<t::produced> records;
  std::map<std::string, int> recount;
  for (int i = 0; i < n; ++i) {
    records.push_back({"o" + std::to_string(i),
                       R"({"amount":)" + std::to_string(i) + R"(,"customer":")" + customer_of(i) + R"("})",
                       std::nullopt});
    ++recount[customer_of(i)];
  }
  auto where = t::produce_bytes(topic, records);

  child app({build + "/order_service", t::bootstrap(), topic, t::unique_name("example-app"), work + "/state"});
  std::map<std::string, int> last_change;  // the newest count each change line gave
  // The answer to `cmd` (the first line starting with its name); change lines on the
  // way are recorded.
  auto ask = [&](const std::string& cmd) {
    if (cmd != "ready") app.send(cmd);
    const auto name = cmd.substr(0, cmd.find(' '));
    for (;;) {
      auto l = app.line();
      REQUIRE_MESSAGE(l.has_value(), "order_service ended before answering " << cmd);
      if (l->rfind("change ", 0) == 0) {
        std::istringstream in(l->substr(7));
        std::string customer, old_count, arrow, new_count;
        in >> customer >> old_count >> arrow >> new_count;
        last_change[customer] = std::stoi(new_count);
        continue;
      }
      REQUIRE_MESSAGE(l->rfind("error", 0) != 0, *l);
      if (l->rfind(name, 0) == 0) return *l;
    }
  };
  // Changes may be printed before start() returns: the listener was there first.
  auto ready = ask("ready");
  CHECK(ready.rfind("ready kstate ", 0) == 0);

  std::map<std::string, int> counts;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    counts.clear();
    int total = 0;
    std::istringstream in(ask("customers").substr(9));
    std::string pair;
    while (in >> pair) {
      auto eq = pair.find('=');
      total += counts[pair.substr(0, eq)] = std::stoi(pair.substr(eq + 1));
    }
    if (total == n || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  CHECK(counts == recount);
  for (const auto& [customer, c] : recount)
    CHECK(ask("customer " + customer) == "customer " + customer + " " + std::to_string(c));
  CHECK(ask("customer nobody") == "customer nobody 0");
  CHECK(ask("orders") == "orders " + std::to_string(n));
  for (int i : {0, 17, 49}) {
    const auto& r = records[static_cast<size_t>(i)];
    CHECK(ask("order " + *r.key) == "order " + *r.key + " " + *r.value +
                                        " partition=" + std::to_string(where[static_cast<size_t>(i)].first) +
                                        " offset=" + std::to_string(where[static_cast<size_t>(i)].second));
  }
  CHECK(ask("order o-missing") == "order o-missing none");
  // Every count was printed as it changed: the last change of each customer is its count.
  app.send("quit");
  while (auto l = app.line()) {
    if (l->rfind("change ", 0) != 0) continue;
    std::istringstream in(l->substr(7));
    std::string customer, old_count, arrow, new_count;
    in >> customer >> old_count >> arrow >> new_count;
    last_change[customer] = std::stoi(new_count);
  }
  CHECK(app.finish() == 0);
  CHECK(last_change == recount);
}
