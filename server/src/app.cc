#include "server/app.h"

#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include "ingest/engine.h"
#include "ingest/partitioner.h"
#include "server/api.h"
#include "server/http_server.h"
#include "storage/db.h"

namespace kstate::server {

struct app::impl {
  app_config cfg;
  std::shared_ptr<prometheus::Registry> metrics = std::make_shared<prometheus::Registry>();
  ownership_registry ownership;
  std::atomic<bool> draining{false};
  std::unique_ptr<storage::db> db;
  std::unique_ptr<query::engine> queries;
  std::unique_ptr<ingest::engine> ingest;
  std::unique_ptr<http_server> http;
  bool stopped = false;
};

app::app(std::unique_ptr<impl> i) : impl_(std::move(i)) {}
app::~app() { stop(); }

result<std::unique_ptr<app>> app::create(app_config cfg) {
  auto i = std::make_unique<impl>();
  i->cfg = std::move(cfg);
  if (i->cfg.advertised_endpoint.empty())
    i->cfg.advertised_endpoint = "http://" + i->cfg.http.listen_address + ":" + std::to_string(i->cfg.http.port);
  return std::unique_ptr<app>(new app(std::move(i)));
}

status app::start() {
  auto& i = *impl_;
  std::vector<std::string> names;
  std::map<std::string, partitioner_fn> partitioners;
  for (const auto& v : i.cfg.views) {
    names.push_back(v.name);
    auto p = ingest::make_partitioner(v.partitioner);
    if (!p) return invalid_argument("views." + v.name + ".partitioner: unknown partitioner '" + v.partitioner + "'");
    partitioners[v.name] = *p;
  }
  auto opened = storage::db::open(i.cfg.rocksdb, names);
  if (!opened.ok()) return opened.error();
  i.db = std::move(opened.value());
  i.queries = std::make_unique<query::engine>(i.cfg.views, *i.db, i.ownership, std::move(partitioners));

  i.http = std::make_unique<http_server>(
      i.cfg.http, make_api_handler(api_context{i.queries.get(), &i.ownership, i.metrics.get(),
                                                i.cfg.advertised_endpoint, &i.draining}));
  if (auto s = i.http->start(); !s.ok()) return s;
  if (i.cfg.http.port == 0)  // report the port actually bound
    i.cfg.advertised_endpoint = "http://" + i.cfg.http.listen_address + ":" + std::to_string(i.http->port());

  i.ingest = std::make_unique<ingest::engine>(i.cfg.ingest, i.cfg.views, *i.db, i.ownership, i.metrics.get());
  if (auto s = i.ingest->start(); !s.ok()) return s;
  spdlog::info("kstate serving {} store(s) on {}", i.cfg.views.size(), i.cfg.advertised_endpoint);
  return status::ok_status();
}

void app::begin_drain() { impl_->draining = true; }

void app::stop() {
  auto& i = *impl_;
  if (i.stopped) return;
  i.stopped = true;
  i.draining = true;
  if (i.http) i.http->stop();
  if (i.ingest) i.ingest->stop();
  if (i.db) {
    if (auto s = i.db->flush(); !s.ok()) spdlog::warn("flushing state on shutdown: {}", s.to_string());
  }
  i.queries.reset();
  i.ingest.reset();
  i.db.reset();
}

uint16_t app::http_port() const { return impl_->http ? impl_->http->port() : 0; }
const query::engine& app::queries() const { return *impl_->queries; }
std::string app::fatal_error() const { return impl_->ingest ? impl_->ingest->fatal_error() : std::string(); }

}  // namespace kstate::server
