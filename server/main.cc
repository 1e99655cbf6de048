// kstate: materializes Kafka topics into RocksDB tables and serves them over HTTP.
// Config, wiring and signals only; everything else lives in the libraries.

#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <thread>
#include <cstdio>
#include <iostream>
#include <spdlog/spdlog.h>

#include "server/app.h"
#include "server/config.h"



int main(int argc, char** argv) {
  CLI::App cli{"kstate: query the state that lives in Kafka"};
  std::string config_path, check_path, log_level = "info";
  bool version = false;
  cli.add_option("-c,--config", config_path, "YAML configuration file");
  cli.add_option("--check-config", check_path, "validate a configuration file, print it (secrets redacted), exit");
  cli.add_option("--log-level", log_level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  cli.add_flag("--version", version, "print the version and exit");
  CLI11_PARSE(cli, argc, argv);

  if (version) {
    std::cout << "kstate " << KSTATE_VERSION << "\n";
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ [%n] %v");

  if (!check_path.empty()) {
    auto cfg = kstate::server::load_config(check_path);
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
  auto cfg = kstate::server::load_config(config_path);
  if (!cfg.ok()) {
    std::cerr << "kstate: " << cfg.error().message() << "\n";
    return 2;
  }

  // Signals are taken synchronously by the main thread; every thread started below
  // inherits the blocked mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto created = kstate::server::app::create(std::move(cfg.value()));
  if (!created.ok()) {
    std::cerr << "kstate: " << created.error().message() << "\n";
    return 1;
  }
  auto& a = *created.value();
  // One thread takes SIGTERM/SIGINT synchronously, at any time, even during start.
  std::atomic<bool> signalled{false};
  std::thread signals([&] {
    int sig = 0;
    if (sigwait(&set, &sig) == 0 && (sig == SIGTERM || sig == SIGINT)) {
      signalled = true;
      spdlog::info("received {}, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      a.request_stop();
    }
  });
  int rc = 0;
  if (auto s = a.start(); !s.ok()) {
    if (!signalled) {
      spdlog::critical("cannot start: {}", s.message());
      rc = 1;
    }
  } else {
    rc = a.wait();
  }
  a.begin_drain();
  a.stop();
  // Wake the signal thread if it is still waiting (fatal error or failed start).
  if (!signalled) pthread_kill(signals.native_handle(), SIGTERM);
  signals.join();
  spdlog::info("stopped");
  return rc;
}
