#include "ingest/standby.h"

#include "kafka_common.h"

#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "ingest/batch_builder.h"

namespace kstate::ingest {
namespace {

using tp = std::pair<std::string, int32_t>;

}  // namespace

std::vector<std::string> standbys_for(const cluster_snapshot& group, const std::string& topic, int32_t partition,
                                      int replicas) {
  std::vector<std::string> endpoints;
  for (const auto& m : group.members)
    if (!m.endpoint.empty()) endpoints.push_back(m.endpoint);
  std::sort(endpoints.begin(), endpoints.end());
  endpoints.erase(std::unique(endpoints.begin(), endpoints.end()), endpoints.end());
  auto owner = group.owner(topic, partition);
  if (!owner) return {};
  auto it = std::find(endpoints.begin(), endpoints.end(), *owner);
  if (it == endpoints.end()) return {};
  std::vector<std::string> out;
  size_t at = static_cast<size_t>(it - endpoints.begin());
  for (int i = 1; i <= replicas && static_cast<size_t>(i) < endpoints.size(); ++i)
    out.push_back(endpoints[(at + i) % endpoints.size()]);
  return out;
}

struct standby_engine::impl {
  ingest_config cfg;
  std::vector<view_def> views;
  storage::db& db;
  const ownership_registry& ownership;
  const membership_registry& membership;
  std::string self;
  int replicas;
  change_notifier* notifier;

  rd_kafka_t* consumer = nullptr;
  std::unique_ptr<batch_builder> builder;
  std::thread thread;
  std::atomic<bool> running{false};
  standby_engine::write_hook before_write_for_testing;

  mutable std::mutex mu;
  std::condition_variable released_cv;
  std::set<tp> current;                  // assigned to the standby consumer (guarded by mu)
  std::set<tp> release_requests;         // asked to be released (guarded by mu)
  uint64_t release_generation = 0;       // incremented each time requests are handled

  impl(ingest_config c, std::vector<view_def> v, storage::db& d, const ownership_registry& o,
       const membership_registry& m, std::string s, int r, change_notifier* n)
      : cfg(std::move(c)), views(std::move(v)), db(d), ownership(o), membership(m), self(std::move(s)),
        replicas(r), notifier(n) {}
  ~impl() {
    if (consumer) rd_kafka_destroy(consumer);
  }

  bool owned_here(const tp& p) const {
    auto t = ownership.topic(p.first);
    if (!t) return false;
    auto it = t->partitions.find(p.second);
    return it != t->partitions.end() && it->second.assigned;
  }

  // What this instance should keep as standby now.
  std::set<tp> desired(const std::set<tp>& excluded) const {
    std::set<tp> out;
    auto snap = membership.current();
    std::set<std::string> topics;
    for (const auto& v : views) topics.insert(v.topic);
    for (const auto& t : topics) {
      int32_t n = ownership.partition_count(t);
      for (int32_t p = 0; p < n; ++p) {
        tp key{t, p};
        if (excluded.count(key) || owned_here(key)) continue;
        auto sb = standbys_for(*snap, t, p, replicas);
        if (std::find(sb.begin(), sb.end(), self) != sb.end()) out.insert(key);
      }
    }
    return out;
  }

  bool flush() {
    if (builder->pending_records() == 0) return true;
    // Rejections are the owner's to count and dead-letter; a standby only moves past them.
    if (!builder->batch().empty()) {
      auto s = db.write(builder->batch());
      if (!s.ok()) {
        log()->error("standby: RocksDB write failed: {}", s.to_string());
        return false;
      }
      if (notifier) notifier->notify();
    }
    builder->reset();
    return true;
  }

  void reassign(const std::set<tp>& want) {
    if (!flush()) return;
    for (const auto& p : current)
      if (!want.count(p)) builder->forget_partition(p.first, p.second);
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(static_cast<int>(want.size()));
    for (const auto& [t, p] : want) {
      std::optional<int64_t> resume;
      bool known = true;
      for (const auto& v : views) {
        if (v.topic != t) continue;
        auto stored = db.stored_position(*db.find_view(v.name), p);
        if (stored.ok() && stored.value()) builder->set_view_position(t, p, v.name, *stored.value());
        else known = false;
      }
      resume = known ? builder->resume_offset(t, p) : std::nullopt;
      rd_kafka_topic_partition_list_add(list, t.c_str(), p)->offset = resume ? *resume : RD_KAFKA_OFFSET_BEGINNING;
    }
    auto err = rd_kafka_assign(consumer, list);
    rd_kafka_topic_partition_list_destroy(list);
    if (err) {
      log()->warn("standby: assign: {}", rd_kafka_err2str(err));
      return;
    }
    if (want != current) log()->info("standby copies: {} partition(s)", want.size());
    current = want;
  }

  void run() {
    auto last_plan = std::chrono::steady_clock::time_point{};
    auto first_pending = std::chrono::steady_clock::time_point{};
    while (running) {
      // Releases first: the group consumer is waiting for them.
      std::set<tp> releasing;
      {
        std::lock_guard lock(mu);
        releasing.swap(release_requests);
      }
      auto now = std::chrono::steady_clock::now();
      if (!releasing.empty() || now - last_plan >= std::chrono::milliseconds(500)) {
        auto want = desired(releasing);
        std::set<tp> cur;
        {
          std::lock_guard lock(mu);
          cur = current;
        }
        if (want != cur || !releasing.empty()) {
          std::lock_guard lock(mu);
          reassign(want);
        }
        last_plan = now;
        if (!releasing.empty()) {
          std::lock_guard lock(mu);
          ++release_generation;
          released_cv.notify_all();
        }
      }
      rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer, builder->pending_records() ? 0 : 50);
      if (m) {
        if (!m->err) {
          tp key{rd_kafka_topic_name(m->rkt), m->partition};
          bool keep;
          {
            std::lock_guard lock(mu);
            keep = current.count(key) > 0;
          }
          if (keep) {
            if (builder->pending_records() == 0) first_pending = std::chrono::steady_clock::now();
            record r;
            r.topic = key.first;
            r.partition = m->partition;
            r.offset = m->offset;
            if (m->key) r.key = std::string_view(static_cast<const char*>(m->key), m->key_len);
            if (m->payload) r.value = std::string_view(static_cast<const char*>(m->payload), m->len);
            builder->add(r);
          }
        }
        rd_kafka_message_destroy(m);
      }
      if (builder->pending_records() &&
          (!m || builder->pending_records() >= static_cast<size_t>(cfg.max_batch_records) ||
           std::chrono::steady_clock::now() - first_pending >= cfg.max_batch_delay)) {
        if (before_write_for_testing) {
          std::vector<tp> touched;
          for (const auto& [p, next] : builder->touched()) touched.push_back(p);
          before_write_for_testing(touched);
        }
        std::lock_guard lock(mu);
        flush();
      }
    }
    std::lock_guard lock(mu);
    flush();
  }
};

standby_engine::standby_engine(ingest_config cfg, std::vector<view_def> views, storage::db& db,
                               const ownership_registry& ownership, const membership_registry& membership,
                               std::string self_endpoint, int replicas, change_notifier* notifier)
    : impl_(std::make_unique<impl>(std::move(cfg), std::move(views), db, ownership, membership,
                                   std::move(self_endpoint), replicas, notifier)) {}

standby_engine::~standby_engine() { stop(); }

status standby_engine::start() {
  auto& i = *impl_;
  auto builder = batch_builder::create(i.db, i.views);
  if (!builder.ok()) return builder.error();
  i.builder = std::move(builder.value());
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[512];
  auto set = [&](const std::string& k, const std::string& v) {
    return rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) == RD_KAFKA_CONF_OK;
  };
  bool ok = set("queued.max.messages.kbytes", "8192") && set("fetch.max.bytes", "8388608") &&
            set("receive.message.max.bytes", "9437184") && set("isolation.level", "read_committed");
  for (const auto& [k, v] : i.cfg.kafka) ok = ok && set(k, v);
  ok = ok && set("bootstrap.servers", i.cfg.bootstrap_servers) && set("client.id", i.cfg.client_id + "-standby") &&
       set("enable.auto.commit", "false") && set("enable.auto.offset.store", "false") &&
       // librdkafka wants a group id even for a consumer that only assigns; this one
       // never joins it (no subscribe) and commits nothing to it.
       set("group.id", i.cfg.application_id + ".standby");
  if (!ok) {
    rd_kafka_conf_destroy(conf);
    return invalid_argument(std::string("standby consumer: ") + err);
  }
  i.consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (!i.consumer) return invalid_argument(std::string("standby consumer: ") + err);
  rd_kafka_poll_set_consumer(i.consumer);
  i.running = true;
  i.thread = std::thread([&i] { i.run(); });
  log()->info("keeping {} standby copy(ies) of each partition", i.replicas);
  return status::ok_status();
}

void standby_engine::stop() {
  auto& i = *impl_;
  if (!i.running.exchange(false)) return;
  if (i.thread.joinable()) i.thread.join();
  if (i.consumer) {
    auto e = rd_kafka_consumer_close(i.consumer);
    if (e) log()->debug("standby: close: {}", rd_kafka_err2str(e));
  }
  std::lock_guard lock(i.mu);
  ++i.release_generation;
  i.released_cv.notify_all();
}

void standby_engine::release(const std::vector<std::pair<std::string, int32_t>>& parts) {
  auto& i = *impl_;
  std::unique_lock lock(i.mu);
  bool any = false;
  for (const auto& p : parts)
    if (i.current.count(p)) {
      i.release_requests.insert(p);
      any = true;
    }
  if (!any || !i.running) return;
  auto gen = i.release_generation;
  if (!i.released_cv.wait_for(lock, i.cfg.standby_release_timeout, [&] { return i.release_generation != gen; }))
    log()->warn("standby: release of {} partition(s) took over {} ms", parts.size(),
                i.cfg.standby_release_timeout.count());
}

void standby_engine::set_before_write_for_testing(write_hook hook) {
  impl_->before_write_for_testing = std::move(hook);
}

std::optional<int64_t> standby_engine::high_watermark(const std::string& topic, int32_t partition) const {
  int64_t low = -1, high = -1;
  if (!impl_->consumer ||
      rd_kafka_get_watermark_offsets(impl_->consumer, topic.c_str(), partition, &low, &high) != RD_KAFKA_RESP_ERR_NO_ERROR ||
      high < 0)
    return std::nullopt;
  return high;
}

std::vector<std::pair<std::string, int32_t>> standby_engine::partitions() const {
  std::lock_guard lock(impl_->mu);
  return {impl_->current.begin(), impl_->current.end()};
}

}  // namespace kstate::ingest
