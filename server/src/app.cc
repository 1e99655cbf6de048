#include "server/app.h"

#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "bootstrap.h"
#include "ingest/engine.h"
#include "ingest/group_secret.h"
#include "core/guard.h"
#include "core/notifier.h"
#include "ingest/membership.h"
#include "ingest/partitioner.h"
#include "ingest/standby.h"
#include "server/auth.h"
#include "server/cors.h"
#include "http/client.h"
#include "query/freshness.h"
#include "server/api.h"
#include "http/server.h"
#include "server/problem.h"
#include "server/state_metrics.h"
#include "snapshots.h"
#include "openapi_json.h"
#include "storage/db.h"
#include "log.h"
#include "core/thread_name.h"

namespace kstate::server {

status secure_state_dir(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
      return status::io_error("state_dir '" + path + "': cannot create: " + std::strerror(errno));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return status::io_error("state_dir '" + path + "': " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return status::invalid_argument("state_dir '" + path + "' is not a directory");
  if (st.st_uid != ::geteuid())
    return status::invalid_argument("state_dir '" + path + "' is owned by uid " + std::to_string(st.st_uid) +
                                    ", not by this user (uid " + std::to_string(::geteuid()) +
                                    "); refusing to use state another user controls");
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return status::invalid_argument("state_dir '" + path + "' is writable by " +
                                    ((st.st_mode & S_IWOTH) ? "other users" : "its group") + " (mode " + mode +
                                    "); refusing to start. Fix: chmod 700 '" + path + "'");
  }
  return status::ok_status();
}

namespace {
std::string scheme_of(const app_config& c) { return c.http.tls.enabled() ? "https://" : "http://"; }

// The peer secret from a file: its first line, at least 16 bytes.
result<std::string> read_secret_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return status::invalid_argument("peer_secret_file '" + path + "': cannot be read");
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  if (line.size() < 16)
    return status::invalid_argument("peer_secret_file '" + path + "': the secret must be at least 16 bytes");
  return line;
}
}  // namespace

struct app::impl {
  app_config cfg;
  std::shared_ptr<prometheus::Registry> metrics = std::make_shared<prometheus::Registry>();
  ownership_registry ownership;
  membership_registry membership;
  std::unique_ptr<ingest::membership_watcher> watcher;
  std::unique_ptr<http::client> peers;
  std::unique_ptr<ingest::standby_engine> standby;
  // Copies partitions taken over without their state from other instances (ingest thread).
  std::unique_ptr<bootstrapper> bootstrap;
  change_notifier notifier;
  std::shared_ptr<peer_secret> secret = std::make_shared<peer_secret>();
  std::atomic<bool> draining{false};
  std::unique_ptr<storage::db> db;
  std::unique_ptr<query::engine> queries;
  std::unique_ptr<query::freshness_waiter> waiter;
  std::unique_ptr<ingest::engine> ingest;
  std::unique_ptr<kstate::http::server> http;
  // The API for requests made in this process (app::in_process_handler).
  http::async_handler in_process;
  bool stopped = false;
  std::mutex mu;
  std::condition_variable cv;
  bool stop_requested = false;
  ingest::engine* starting_ingest = nullptr;  // guarded by mu
  // Reads the group's secret from Kafka until it has it or the app stops.
  std::thread secret_reader;
  bool secret_reader_stop = false;  // guarded by mu
  // When the group fenced this member and a new consumer rejoined (wait()'s thread).
  std::deque<std::chrono::steady_clock::time_point> rejoins;

  void read_secret_until_known();
  status start_ingest();
  // After the group fenced this member: the failed engine stops (its unwritten batch is
  // read again), a new one on the same stores rejoins. At most 5 times in 10 minutes:
  // beyond, another instance really uses this group.instance.id, and the instance stops.
  bool rejoin();
};

status app::impl::start_ingest() {
  ingest = std::make_unique<ingest::engine>(cfg.ingest, cfg.views, *db, ownership, metrics.get(), &notifier);
  {
    std::lock_guard lock(mu);
    if (stop_requested) return status::unavailable("stop requested during start");
    starting_ingest = ingest.get();
  }
  auto started = ingest->start();
  std::lock_guard lock(mu);
  starting_ingest = nullptr;
  return started;
}

bool app::impl::rejoin() {
  const auto now = std::chrono::steady_clock::now();
  while (!rejoins.empty() && now - rejoins.front() > std::chrono::minutes(10)) rejoins.pop_front();
  if (rejoins.size() >= 5) return false;
  rejoins.push_back(now);
  server_log()->warn(
      "ingest's Kafka clients failed for good ({}): the consumer group fenced this member (it lost its session to a "
      "broker or coordinator unreachable for longer than session.timeout.ms, or another instance uses the same "
      "group.instance.id), or the transactional producer failed; rejoining with new clients (rejoin {} of at most 5 "
      "in 10 minutes)",
      ingest->fatal_error(), rejoins.size());
  ingest->stop();
  auto started = start_ingest();
  if (!started.ok()) {
    server_log()->critical("rejoining the group failed: {}", started.to_string());
    return false;
  }
  server_log()->info("rejoined the group with a new consumer");
  return true;
}

void app::impl::read_secret_until_known() {
  // Each attempt is bounded, so a stop waits for at most one of them.
  constexpr auto attempt_timeout = std::chrono::seconds(5);
  bool reported = false;
  for (;;) {
    auto got = ingest::read_group_secret(cfg.ingest, attempt_timeout);
    if (got.ok()) {
      {
        std::lock_guard lock(mu);  // start() waits for it under mu
        secret->set(std::move(*got));
      }
      if (reported) server_log()->info("read the secret shared with the other instances");
      cv.notify_all();
      return;
    }
    if (!reported) {
      server_log()->error(
          "no secret shared with the other instances yet ({}): requests for partitions held elsewhere are "
          "answered 503 until it is read (set peer_secret_file, or allow kstate to create and read the "
          "topic {}); retrying",
          got.error().message(), ingest::group_secret_topic(cfg.application_id));
      reported = true;
    }
    std::unique_lock lock(mu);
    if (cv.wait_for(lock, std::chrono::seconds(1), [&] { return secret_reader_stop; })) return;
  }
}

namespace {

// The group member name an advertised endpoint gives: unique in the cluster, since
// peers forward to it, and the same after the state directory was lost or emptied, so
// a rebuilt instance takes its old place in the group instead of waiting out the old
// member's session. The characters Kafka accepts in a group.instance.id
// ([A-Za-z0-9._-]), the scheme dropped, others as '_'. Empty without an endpoint.
std::string member_name(const std::string& endpoint) {
  std::string_view e = endpoint;
  if (auto at = e.find("://"); at != std::string_view::npos) e.remove_prefix(at + 3);
  std::string out;
  for (char ch : e) out += std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' ? ch : '_';
  return out.empty() ? out : "at-" + out;
}

// Where the state directory lives: the host (its name and, where one is kept, its
// machine id) and the directory (its real path, device and inode). A copy or a move of
// the directory changes at least one of them; a restart on the same host changes none.
std::string state_dir_place(const std::string& dir) {
  char host[256] = {};
  (void)::gethostname(host, sizeof host - 1);  // an empty name only weakens the check
  std::string machine;
  std::ifstream("/etc/machine-id") >> machine;
  std::error_code ec;
  const auto real = std::filesystem::canonical(dir, ec);
  struct stat st {};
  (void)::stat(dir.c_str(), &st);  // the directory exists: RocksDB just opened it
  return "host=" + std::string(host) + ";machine=" + machine + ";path=" + (ec ? dir : real.string()) +
         ";dev=" + std::to_string(st.st_dev) + ";ino=" + std::to_string(st.st_ino);
}

}  // namespace

app::app(std::unique_ptr<impl> i) : impl_(std::move(i)) {}
app::~app() { stop(); }

result<std::unique_ptr<app>> app::create(app_config cfg) {
  auto i = std::make_unique<impl>();
  i->cfg = std::move(cfg);
  if (i->cfg.advertised_endpoint.empty())
    i->cfg.advertised_endpoint =
        scheme_of(i->cfg) + i->cfg.http.listen_address + ":" + std::to_string(i->cfg.http.port);
  return std::unique_ptr<app>(new app(std::move(i)));
}

status app::start() {
  auto& i = *impl_;
  // A join view's sides have a column family of their own.
  std::vector<std::string> names = column_family_names(i.cfg.views);
  std::map<std::string, partitioner_fn> partitioners;
  for (const auto& v : i.cfg.views) {
    auto p = ingest::make_partitioner(v.partitioner);
    if (!p)
      return status::invalid_argument("views." + v.name + ".partitioner: unknown partitioner '" + v.partitioner + "'");
    partitioners[v.name] = *p;
  }
  if (auto s = secure_state_dir(i.cfg.rocksdb.path); !s.ok()) return s;
  std::shared_ptr<token_authenticator> auth;
  if (!i.cfg.auth.token_file.empty()) {
    auto a = token_authenticator::from_file(i.cfg.auth.token_file);
    if (!a.ok()) return status::invalid_argument("auth.token_file: " + a.error().message());
    auth = std::move(a.value());
    server_log()->info("bearer tokens required: {} token(s) from {}", auth->size(), i.cfg.auth.token_file);
  }
  for (const auto& v : i.cfg.views) {
    if (v.windowed()) i.cfg.rocksdb.windowed[v.name] = storage::windowed_store{*v.window, stream_time_position_name(v)};
    if (v.ttl) i.cfg.rocksdb.ttl_ms[v.name] = v.ttl->after_ms;
    if (v.versioned)
      i.cfg.rocksdb.versioned[v.name] = storage::versioned_store{v.versioned->history_ms, stream_time_position_name(v)};
  }
  auto opened = storage::db::open(i.cfg.rocksdb, names);
  if (!opened.ok()) return opened.error();
  i.db = std::move(opened.value());
  if (const auto& q = i.db->quarantined())
    server_log()->warn(
        "the state was damaged ({}) and moved to {}: every store is rebuilt; /readyz answers 503 "
        "until it caught up. Remove that directory once no longer needed",
        q->reason, q->path);
  auto identity = i.db->instance_id(state_dir_place(i.cfg.state_dir));
  if (!identity.ok()) return identity.error();
  i.cfg.ingest.instance_id = identity->id;
  if (identity->renewed)
    server_log()->warn(
        "the state directory {} was copied or moved (another host, path or file system): this instance takes a "
        "new identity, {}, so it never shares one with the instance the directory came from",
        i.cfg.state_dir, identity->id);
  i.queries = std::make_unique<query::engine>(i.cfg.views, *i.db, i.ownership, std::move(partitioners));
  i.waiter = std::make_unique<query::freshness_waiter>(*i.queries, i.notifier, i.cfg.waits);

  api_context ctx;
  ctx.queries = i.queries.get();
  ctx.waiter = i.waiter.get();
  ctx.ownership = &i.ownership;
  http::client_config peer_cfg;
  peer_cfg.max_idle_per_peer = i.cfg.peer_connections;
  if (i.cfg.http.tls.enabled()) {
    // Instances verify each other like any client would, and present their own
    // certificate to peers that require client certificates.
    peer_cfg.tls_ca_file = !i.cfg.peer_ca_file.empty() ? i.cfg.peer_ca_file : i.cfg.http.tls.client_ca_file;
    peer_cfg.tls_cert_file = i.cfg.http.tls.cert_file;
    peer_cfg.tls_key_file = i.cfg.http.tls.key_file;
  }
  i.peers = std::make_unique<http::client>(peer_cfg);
  if (i.cfg.http.tls.enabled() && !i.peers->tls_error().empty())
    return status::invalid_argument("http.tls: instances could not forward to each other: " + i.peers->tls_error());
  ctx.membership = &i.membership;
  ctx.peers = i.peers.get();
  ctx.peer_batch = i.cfg.peer_batch;
  ctx.secret = i.secret;
  ctx.group = i.cfg.application_id;
  ctx.standby_replicas = i.cfg.standby_replicas;
  auto* standby_slot = &i.standby;
  auto* ownership = &i.ownership;
  ctx.high_watermark = [standby_slot, ownership](const std::string& topic, int32_t p) -> std::optional<int64_t> {
    if (auto t = ownership->topic(topic)) {
      auto it = t->partitions.find(p);
      if (it != t->partitions.end() && it->second.assigned && it->second.high_watermark >= 0)
        return it->second.high_watermark;
    }
    if (*standby_slot) return (*standby_slot)->high_watermark(topic, p);
    return std::nullopt;
  };
  ctx.metrics = i.metrics.get();
  ctx.collectables.push_back(make_state_metrics(*i.db, i.cfg.views, i.ownership, i.cfg.application_id));
  ctx.draining = &i.draining;
  ctx.openapi_json = std::string(openapi_json());
  ctx.limits = i.cfg.query;
  // A silent subscription says where it is well within the time the server lets a
  // stream go without writing.
  ctx.limits.feed_heartbeat =
      std::min(ctx.limits.feed_heartbeat, std::max(std::chrono::milliseconds(100), i.cfg.http.read_timeout / 2));
  ctx.open_feed = [ingest_cfg = i.cfg.ingest, depth = i.cfg.query.max_json_depth](
                      const view_def& v, const std::map<int32_t, std::optional<int64_t>>& start,
                      const ingest::feed_options& options) {
    return ingest::change_feed::open(ingest_cfg, v, start, depth, options);
  };
  ctx.snapshots = std::make_shared<snapshot_sender>(*i.db, snapshot_sender_limits{}, i.cfg.views);
  ctx.ui_dir = i.cfg.ui_dir;
  ctx.auth = std::move(auth);
  ctx.open_metrics = i.cfg.auth.open_metrics;
  // The server is created after the context that reports its connections.
  auto* http_slot = &i.http;
  ctx.open_connections = [http_slot] { return *http_slot ? (*http_slot)->open_connections() : size_t{0}; };
  ctx.refused_connections = [http_slot] { return *http_slot ? (*http_slot)->refused_connections() : uint64_t{0}; };
  // The API is made once the port is bound: every answer names the endpoint actually
  // served (served_by), which a port 0 only gives after the bind. Until then (a request
  // that found the port before start() returned) the server answers 503.
  auto api_slot = std::make_shared<std::atomic<std::shared_ptr<const http::async_handler>>>();
  if (i.cfg.serve_http) {
    auto http_cfg = i.cfg.http;
    http_cfg.render_error = render_server_error;  // the server's own errors in kstate's scheme
    http::async_handler late = [api_slot](const http::request& req, http::responder reply) {
      if (auto api = api_slot->load()) return (*api)(req, std::move(reply));
      reply(problem(failure_reason::not_caught_up, "the instance is starting", req.path));
    };
    i.http = std::make_unique<http::server>(std::move(http_cfg), with_cors(i.cfg.cors, std::move(late)));
    if (auto s = i.http->start(); !s.ok()) return s;
    if (i.cfg.http.port == 0)  // report the port actually bound
      i.cfg.advertised_endpoint = scheme_of(i.cfg) + i.cfg.http.listen_address + ":" + std::to_string(i.http->port());
  }
  ctx.instance = i.cfg.advertised_endpoint;
  {
    // The process's own requests: trusted, and not counted as HTTP requests.
    auto own = ctx;
    own.auth = nullptr;
    own.metrics = nullptr;
    own.collectables.clear();
    i.in_process = make_api_handler(std::move(own));
  }
  if (i.http) api_slot->store(std::make_shared<const http::async_handler>(make_api_handler(std::move(ctx))));

  // The group description names each member's endpoint; a rebalance refreshes it. The
  // member name follows it, once a port 0 was replaced by the one bound: two instances
  // started on port 0 must not share a group.instance.id (the group fences one).
  i.cfg.ingest.advertised_endpoint = i.cfg.advertised_endpoint;
  i.cfg.ingest.member_name = member_name(i.cfg.advertised_endpoint);
  i.watcher = std::make_unique<ingest::membership_watcher>(i.cfg.ingest, ingest::membership_config{}, i.membership);
  if (auto s = i.watcher->start(); !s.ok()) return s;
  auto* watcher = i.watcher.get();
  i.cfg.ingest.on_rebalance = [watcher] { watcher->refresh_soon(); };
  // A partition taken over is first released by the standby copy, so the owner resumes
  // exactly where the copy stopped.
  // Then what is still missing is copied from an instance that holds it, if one does.
  i.bootstrap = std::make_unique<bootstrapper>(i.cfg.bootstrap, i.cfg.views, *i.db, i.membership, *i.peers, i.secret,
                                               i.cfg.advertised_endpoint, i.draining, i.metrics.get());
  i.cfg.ingest.before_assign = [standby_slot,
                                boot = i.bootstrap.get()](const std::vector<std::pair<std::string, int32_t>>& parts) {
    if (*standby_slot) (*standby_slot)->release(parts);
    boot->run(parts);
  };
  i.cfg.ingest.after_revoke = [standby_slot](const std::vector<std::pair<std::string, int32_t>>& parts) {
    if (*standby_slot) (*standby_slot)->give_back(parts);
  };
  // The secret the instances sign their requests to each other with: from a file, or
  // the group's own in Kafka, read beside the ingest start-up (which is what reports
  // unreachable brokers and refused credentials). Without it this instance answers what
  // it holds and refuses the rest with 503, so not having it yet does not stop it.
  if (!i.cfg.peer_secret_file.empty()) {
    auto secret = read_secret_file(i.cfg.peer_secret_file);
    if (!secret.ok()) return secret.error();
    i.secret->set(std::move(*secret));
  } else {
    i.secret_reader = std::thread([&i] {
      name_this_thread("ks-secret");
      // Without the secret, forwarding stays off (503s); the process goes on serving.
      if (auto why = guarded([&i] { i.read_secret_until_known(); }))
        server_log()->critical("reading the secret shared with the other instances stopped: {}", *why);
    });
  }
  if (auto started = i.start_ingest(); !started.ok()) return started;
  {
    // Usually read by now; give it a moment more, so that a started instance forwards.
    std::unique_lock lock(i.mu);
    i.cv.wait_for(lock, std::chrono::seconds(10), [&] { return i.secret->get() != nullptr || i.stop_requested; });
  }
  if (i.cfg.standby_replicas > 0) {
    // Table views' copies follow their source topics, aggregate views' their changelogs.
    i.standby = std::make_unique<ingest::standby_engine>(i.cfg.ingest, i.cfg.views, *i.db, i.ownership, i.membership,
                                                         i.cfg.advertised_endpoint, i.cfg.standby_replicas, &i.notifier,
                                                         i.metrics.get());
    if (auto s = i.standby->start(); !s.ok()) return s;
  }
  server_log()->info("kstate serving {} store(s) on {}", i.cfg.views.size(), i.cfg.advertised_endpoint);
  return status::ok_status();
}

void app::begin_drain() {
  impl_->draining = true;
  if (impl_->http) impl_->http->begin_drain();
}

void app::shutdown(bool drain) {
  begin_drain();
  if (drain && impl_->http && impl_->cfg.drain_delay.count() > 0) {
    server_log()->info("draining for {} ms before closing connections", impl_->cfg.drain_delay.count());
    std::this_thread::sleep_for(impl_->cfg.drain_delay);
  }
  stop();
}

void app::end_waits() {
  if (impl_->waiter) impl_->waiter->shutdown();
}

void app::request_stop() {
  std::lock_guard lock(impl_->mu);
  impl_->stop_requested = true;
  if (impl_->starting_ingest) impl_->starting_ingest->abort_start();
  impl_->cv.notify_all();
}

int app::wait() {
  std::unique_lock lock(impl_->mu);
  for (;;) {
    if (impl_->stop_requested) return 0;
    if (auto why = impl_->db->must_reopen(); !why.empty()) {
      // Serving from it until the restart is still right (RocksDB keeps a deleted file
      // open, and answers reads after a failed write), but it must be opened again.
      impl_->draining = true;
      server_log()->critical("the state must be reopened ({}): restarting (a damaged state is moved aside and rebuilt)",
                             why);
      return restart_to_reopen;
    }
    if (!fatal_error().empty()) {
      if (impl_->ingest->fenced()) {
        lock.unlock();
        const bool rejoined = impl_->rejoin();
        lock.lock();
        if (impl_->stop_requested) return 0;
        if (rejoined) continue;
        if (fatal_error().empty()) return 1;  // a new consumer failed to start, and said why
      }
      server_log()->critical("ingest stopped: {}", fatal_error());
      return 1;
    }
    impl_->cv.wait_for(lock, std::chrono::milliseconds(200));
  }
}

void app::stop() {
  auto& i = *impl_;
  if (i.stopped) return;
  i.stopped = true;
  i.draining = true;
  if (i.secret_reader.joinable()) {
    {
      std::lock_guard lock(i.mu);
      i.secret_reader_stop = true;
    }
    i.cv.notify_all();
    i.secret_reader.join();
  }
  // Pending min_position waits get their 503 while connections are still open.
  if (i.waiter) i.waiter->shutdown();
  if (i.http) i.http->stop();
  if (i.standby) i.standby->stop();
  if (i.ingest) i.ingest->stop();
  // After the engine: its rebalance hook calls the watcher until it stops.
  if (i.watcher) i.watcher->stop();
  // Pending min_position waits are answered (503) while the handler still exists.
  i.waiter.reset();
  i.http.reset();
  i.in_process = nullptr;
  i.peers.reset();
  if (i.db) {
    if (auto s = i.db->flush(); !s.ok()) server_log()->warn("flushing state on shutdown: {}", s.to_string());
  }
  i.queries.reset();
  i.ingest.reset();
  i.bootstrap.reset();
  i.db.reset();
}

uint16_t app::http_port() const { return impl_->http ? impl_->http->port() : 0; }
const query::engine& app::queries() const { return *impl_->queries; }
http::async_handler app::in_process_handler() const { return impl_->in_process; }
const ownership_registry& app::ownership() const { return impl_->ownership; }
const membership_registry& app::membership() const { return impl_->membership; }
const std::string& app::endpoint() const { return impl_->cfg.advertised_endpoint; }
std::string app::fatal_error() const { return impl_->ingest ? impl_->ingest->fatal_error() : std::string(); }

}  // namespace kstate::server
