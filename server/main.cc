// kstate: materializes Kafka topics into RocksDB tables and serves them over HTTP.
// Config, wiring and signals only; everything else lives in the libraries.

#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <termios.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <thread>

#include "server/app.h"
#include "server/auth.h"
#include "server/config.h"

extern char** environ;

namespace {

// JSON lines: one object per log record, fields escaped by spdlog's formatter pattern
// ({"ts","level","logger","msg"}). Messages are escaped for quotes and backslashes.
class json_formatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    auto escape = [&](std::string_view s) {
      for (unsigned char c : s) {
        switch (c) {
          case '"': dest.append(std::string_view("\\\"")); break;
          case '\\': dest.append(std::string_view("\\\\")); break;
          case '\n': dest.append(std::string_view("\\n")); break;
          case '\r': dest.append(std::string_view("\\r")); break;
          case '\t': dest.append(std::string_view("\\t")); break;
          default:
            if (c < 0x20) fmt::format_to(std::back_inserter(dest), "\\u{:04x}", c);
            else dest.push_back(static_cast<char>(c));
        }
      }
    };
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(msg.time.time_since_epoch()).count();
    fmt::format_to(std::back_inserter(dest), R"({{"ts_ms":{},"level":")", ms);
    auto lvl = spdlog::level::to_string_view(msg.level);
    dest.append(lvl.data(), lvl.data() + lvl.size());
    dest.append(std::string_view(R"(","logger":")"));
    escape(std::string_view(msg.logger_name.data(), msg.logger_name.size()));
    dest.append(std::string_view(R"(","msg":")"));
    escape(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(std::string_view("\"}\n"));
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<json_formatter>(); }
};

// The token to hash: the first line of standard input, or, on a terminal, typed at a
// prompt without echo. Never a command-line argument: those end up in shell history
// and in every user's `ps`.
std::optional<std::string> read_token() {
  const bool tty = ::isatty(STDIN_FILENO);
  termios saved{};
  if (tty) {
    std::cerr << "Token: " << std::flush;
    if (::tcgetattr(STDIN_FILENO, &saved) == 0) {
      termios quiet = saved;
      quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
      ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
    }
  }
  std::string line;
  const bool got = static_cast<bool>(std::getline(std::cin, line));
  if (tty) {
    ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved);
    std::cerr << "\n";
  }
  if (!got && line.empty()) return std::nullopt;
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  if (line.empty()) return std::nullopt;
  return line;
}

}  // namespace

// Raises the soft RLIMIT_NOFILE to the hard limit, and lowers http.max_connections
// (with a warning) when it would leave fewer than `reserved_fds` descriptors for
// RocksDB's files, Kafka's sockets and connections to other instances.
void fit_connections_to_fd_limit(kstate::server::app_config& cfg) {
  constexpr rlim_t reserved_fds = 1024;
  struct rlimit lim {};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < lim.rlim_max) {
    struct rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
    else
      spdlog::warn("cannot raise the open file limit from {} to {}: {}", lim.rlim_cur, lim.rlim_max,
                   std::strerror(errno));
  }
  if (lim.rlim_cur == RLIM_INFINITY) return;
  const rlim_t room = lim.rlim_cur > reserved_fds + 16 ? lim.rlim_cur - reserved_fds : 16;
  if (cfg.http.max_connections > room) {
    spdlog::warn(
        "http.max_connections lowered from {} to {}: the open file limit is {} and {} are kept for RocksDB "
        "and Kafka (raise it, e.g. LimitNOFILE= in a systemd unit)",
        cfg.http.max_connections, room, lim.rlim_cur, reserved_fds);
    cfg.http.max_connections = room;
  }
}

int main(int argc, char** argv) {
  // glibc gives each thread that allocates its own arena (up to 8 per core); memory
  // freed in one arena is not reused by others, which grows RSS far past what is in
  // use. A few arenas keep the fixed overhead small (docs/operations.md); the
  // MALLOC_ARENA_MAX environment variable still overrides this.
  if (!std::getenv("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, 2);
  CLI::App cli{"kstate: query the state that lives in Kafka"};
  std::string config_path, check_path, log_level = "info", log_format = "text";
  std::vector<std::string> sets, kafka_props;
  std::string listen, bootstrap, state_dir, application_id, advertised;
  bool version = false;
  cli.add_option("-c,--config", config_path, "YAML configuration file");
  cli.add_option("--check-config", check_path,
                 "validate a configuration file (with environment and flag overrides), print the effective "
                 "configuration with secrets redacted, exit");
  cli.add_option("--set", sets, "override any key: --set http.threads=4 (repeatable)");
  cli.add_option("-X", kafka_props, "librdkafka property: -X security.protocol=SASL_SSL (repeatable)");
  cli.add_option("--listen", listen, "same as --set http.listen=HOST:PORT");
  cli.add_option("--bootstrap-servers", bootstrap, "same as --set bootstrap_servers=...");
  cli.add_option("--state-dir", state_dir, "same as --set state_dir=...");
  cli.add_option("--application-id", application_id, "same as --set application_id=...");
  cli.add_option("--advertised-endpoint", advertised, "same as --set advertised_endpoint=...");
  cli.add_option("--log-level", log_level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  cli.add_option("--log-format", log_format, "text|json (JSON lines)")->check(CLI::IsMember({"text", "json"}));
  cli.add_flag("--version", version, "print the version and exit");
  auto* token_cmd = cli.add_subcommand("token", "bearer tokens for auth.token_file (docs/security.md)");
  token_cmd->require_subcommand(1);
  auto* token_hash = token_cmd->add_subcommand(
      "hash", "print the SHA-256 of a token read from standard input (or typed at a prompt), for the token file");
  auto* token_new = token_cmd->add_subcommand("new", "print a new random token and, on standard error, its SHA-256");
  CLI11_PARSE(cli, argc, argv);

  if (*token_hash) {
    auto token = read_token();
    if (!token) {
      std::cerr << "kstate: token hash: no token on standard input\n";
      return 2;
    }
    std::cout << kstate::server::sha256_hex(*token) << "\n";
    return 0;
  }
  if (*token_new) {
    auto token = kstate::server::random_token();
    std::cout << token << "\n";
    std::cerr << "sha256: " << kstate::server::sha256_hex(token) << "\n";
    return 0;
  }

  if (version) {
    std::cout << "kstate " << KSTATE_VERSION << "\n";
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (log_format == "json") spdlog::set_formatter(std::make_unique<json_formatter>());
  else spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ [%n] %v");

  // Precedence: defaults < file < environment < flags (later overrides win).
  auto overrides = kstate::server::overrides_from_env(environ);
  auto flag = [&](const std::string& path, const std::string& value, const std::string& origin) {
    overrides.push_back({path, value, origin});
  };
  for (const auto& s : sets) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::cerr << "kstate: --set " << s << ": expected KEY=VALUE\n";
      return 2;
    }
    flag(s.substr(0, eq), s.substr(eq + 1), "--set");
  }
  for (const auto& x : kafka_props) {
    auto eq = x.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::cerr << "kstate: -X " << x << ": expected PROPERTY=VALUE\n";
      return 2;
    }
    flag("kafka." + x.substr(0, eq), x.substr(eq + 1), "-X");
  }
  if (!listen.empty()) flag("http.listen", listen, "--listen");
  if (!bootstrap.empty()) flag("bootstrap_servers", bootstrap, "--bootstrap-servers");
  if (!state_dir.empty()) flag("state_dir", state_dir, "--state-dir");
  if (!application_id.empty()) flag("application_id", application_id, "--application-id");
  if (!advertised.empty()) flag("advertised_endpoint", advertised, "--advertised-endpoint");

  if (!check_path.empty()) {
    auto cfg = kstate::server::load_config(check_path, overrides);
    if (!cfg.ok()) {
      std::cerr << "kstate: " << cfg.error().message() << "\n";
      return 2;
    }
    std::cout << kstate::server::render_config(*cfg);
    return 0;
  }
  if (config_path.empty()) {
    std::cerr << "kstate: --config FILE is required (see --help)\n";
    return 2;
  }
  auto cfg = kstate::server::load_config(config_path, overrides);
  if (!cfg.ok()) {
    std::cerr << "kstate: " << cfg.error().message() << "\n";
    return 2;
  }

  // Signals are taken synchronously by one thread; every thread started below inherits
  // the blocked mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Every connection, RocksDB file and Kafka socket is a file descriptor: take the
  // whole hard limit, then fit http.max_connections inside it.
  fit_connections_to_fd_limit(cfg.value());

  // One thread takes SIGTERM/SIGINT at any time, even during start, and stops whichever
  // app is current.
  std::mutex current_mu;
  kstate::server::app* current = nullptr;  // guarded by current_mu
  std::atomic<bool> signalled{false}, exiting{false};
  std::thread signals([&] {
    int sig = 0;
    if (sigwait(&set, &sig) == 0 && (sig == SIGTERM || sig == SIGINT) && !exiting) {
      spdlog::info("received {}, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      std::lock_guard lock(current_mu);
      signalled = true;
      if (current) current->request_stop();
    }
  });
  int rc = 0;
  // State that must be reopened while serving (app::restart_to_reopen): the app stops,
  // and a new one on the same configuration opens it again (moving a damaged state aside
  // and rebuilding it), in this process, so no supervisor is needed for it. A start that
  // fails after such a restart (the state directory still refusing writes) is tried
  // again every 5 s: the instance was running with this configuration.
  bool restarting = false;
  for (;;) {
    auto created = kstate::server::app::create(cfg.value());
    if (!created.ok()) {
      std::cerr << "kstate: " << created.error().message() << "\n";
      rc = 1;
      break;
    }
    auto& a = *created.value();
    {
      std::lock_guard lock(current_mu);
      current = &a;
      if (signalled) a.request_stop();
    }
    bool served = false;
    if (auto s = a.start(); !s.ok()) {
      if (!signalled) {
        spdlog::critical("cannot start: {}{}", s.message(), restarting ? "; trying again in 5 s" : "");
        rc = 1;
      }
    } else {
      served = true;
      rc = a.wait();
    }
    // Drain only an instance that was serving and is stopping on request.
    a.shutdown(served && rc == 0);
    {
      std::lock_guard lock(current_mu);
      current = nullptr;
    }
    if (signalled) break;
    if (rc == kstate::server::app::restart_to_reopen) {
      spdlog::warn("restarting on the same configuration to reopen the state");
      restarting = true;
    } else if (rc == 1 && restarting && !served) {
      for (int i = 0; i < 50 && !signalled; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } else {
      break;
    }
    rc = 0;
  }
  // Wake the signal thread if it is still waiting (fatal error or failed start).
  exiting = true;
  // Not to end the thread: it waits in sigwait(), which this signal returns from.
  if (!signalled) pthread_kill(signals.native_handle(), SIGTERM);  // NOLINT(bugprone-bad-signal-to-kill-thread)
  signals.join();
  spdlog::info("stopped");
  return rc;
}
