#include "server/state_metrics.h"

#include <boost/version.hpp>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <deque>
#include <iterator>
#include <set>

#include "ingest/engine.h"

namespace kstate::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

class state_metrics final : public prometheus::Collectable {
 public:
  state_metrics(const storage::db& db, const std::vector<view_def>& views, const ownership_registry& ownership,
                std::string group)
      : db_(db), views_(views), ownership_(ownership), group_(std::move(group)) {}

  std::vector<MetricFamily> Collect() const override {
    // family() hands out references that are filled in later: a deque keeps them valid
    // however many families are added. Stores and partitions are samples (labels) of
    // these families: more of them add samples, never families.
    std::deque<MetricFamily> families;
    auto family = [&](std::string name, std::string help, MetricType type) -> MetricFamily& {
      families.push_back(MetricFamily{std::move(name), std::move(help), type, {}});
      return families.back();
    };
    auto gauge = [](MetricFamily& f, std::vector<ClientMetric::Label> labels, double v) {
      ClientMetric m;
      m.label = std::move(labels);
      m.gauge.value = v;
      f.metric.push_back(std::move(m));
    };
    auto counter = [](MetricFamily& f, std::vector<ClientMetric::Label> labels, double v) {
      ClientMetric m;
      m.label = std::move(labels);
      m.counter.value = v;
      f.metric.push_back(std::move(m));
    };

    auto& build = family("kstate_build_info", "Versions of kstate and the libraries it runs on", MetricType::Gauge);
    gauge(build,
          {{"version", KSTATE_VERSION},
           {"librdkafka", ingest::librdkafka_version()},
           {"rocksdb", storage::db::rocksdb_version()},
           {"boost", std::to_string(BOOST_VERSION / 100000) + "." + std::to_string(BOOST_VERSION / 100 % 1000) + "." +
                         std::to_string(BOOST_VERSION % 100)}},
          1);

    // Per store: RocksDB properties.
    struct prop {
      const char* name;
      const char* help;
      uint64_t storage::view_stats::*field;
    };
    static const prop props[] = {
        {"kstate_rocksdb_estimate_num_keys", "rocksdb.estimate-num-keys: estimated keys in the store",
         &storage::view_stats::estimated_keys},
        {"kstate_rocksdb_total_sst_files_size_bytes", "rocksdb.total-sst-files-size",
         &storage::view_stats::total_sst_bytes},
        {"kstate_rocksdb_live_sst_files_size_bytes", "rocksdb.live-sst-files-size",
         &storage::view_stats::live_sst_bytes},
        {"kstate_rocksdb_cur_size_all_mem_tables_bytes", "rocksdb.cur-size-all-mem-tables: memtable bytes",
         &storage::view_stats::memtable_bytes},
        {"kstate_rocksdb_estimate_pending_compaction_bytes", "rocksdb.estimate-pending-compaction-bytes",
         &storage::view_stats::pending_compaction_bytes},
        {"kstate_rocksdb_num_running_compactions", "rocksdb.num-running-compactions (whole database)",
         &storage::view_stats::running_compactions},
        {"kstate_rocksdb_num_running_flushes", "rocksdb.num-running-flushes (whole database)",
         &storage::view_stats::running_flushes},
    };
    std::vector<std::pair<std::string, storage::view_stats>> stats;
    for (const auto& v : views_) {
      auto id = db_.find_view(v.name);
      if (!id) continue;
      if (auto s = db_.stats(*id); s.ok()) stats.emplace_back(v.name, *s);
    }
    for (const auto& p : props) {
      auto& f = family(p.name, p.help, MetricType::Gauge);
      for (const auto& [name, s] : stats) gauge(f, {{"store", name}}, static_cast<double>(s.*(p.field)));
    }

    auto& expired =
        family("kstate_store_expired_windows_total",
               "Windows deleted from disk by retention (compaction filter) since start", MetricType::Counter);
    for (const auto& v : views_)
      if (v.windowed())
        for (const auto& [name, s] : stats)
          if (name == v.name) counter(expired, {{"store", name}}, static_cast<double>(s.expired_windows));
    auto& expired_keys = family("kstate_store_expired_keys_total",
                                "Expired keys of stores with a ttl deleted from disk (compaction filter) since start",
                                MetricType::Counter);
    for (const auto& v : views_)
      if (v.ttl)
        for (const auto& [name, s] : stats)
          if (name == v.name) counter(expired_keys, {{"store", name}}, static_cast<double>(s.expired_keys));
    auto& expired_versions = family(
        "kstate_store_expired_versions_total",
        "Versions of versioned stores deleted from disk after leaving the history (compaction filter) since start",
        MetricType::Counter);
    auto& late_records = family(
        "kstate_store_late_records_total",
        "Records of versioned stores dropped as older than stream time minus history since start", MetricType::Counter);
    for (const auto& v : views_)
      if (v.versioned)
        for (const auto& [name, s] : stats)
          if (name == v.name) {
            counter(expired_versions, {{"store", name}}, static_cast<double>(s.expired_versions));
            counter(late_records, {{"store", name}}, static_cast<double>(s.late_versions));
          }

    // The block cache is shared by every store (one memory budget), so its figures are
    // for the whole database.
    auto d = db_.stats();
    gauge(family("kstate_rocksdb_block_cache_capacity_bytes", "Shared block cache capacity (the memory budget)",
                 MetricType::Gauge),
          {}, static_cast<double>(d.block_cache_capacity));
    gauge(family("kstate_rocksdb_block_cache_usage_bytes", "Shared block cache usage, memtables charged to it included",
                 MetricType::Gauge),
          {}, static_cast<double>(d.block_cache_usage));
    gauge(family("kstate_rocksdb_block_cache_pinned_usage_bytes", "Pinned entries of the shared block cache",
                 MetricType::Gauge),
          {}, static_cast<double>(d.block_cache_pinned));
    counter(family("kstate_rocksdb_block_cache_hits_total", "Block cache hits", MetricType::Counter), {},
            static_cast<double>(d.block_cache_hits));
    counter(family("kstate_rocksdb_block_cache_misses_total", "Block cache misses", MetricType::Counter), {},
            static_cast<double>(d.block_cache_misses));
    counter(
        family("kstate_rocksdb_write_stall_seconds_total", "Time writes were stalled by RocksDB", MetricType::Counter),
        {}, static_cast<double>(d.write_stall_micros) / 1e6);
    counter(family("kstate_rocksdb_background_errors_total", "RocksDB background errors (flush, compaction)",
                   MetricType::Counter),
            {}, static_cast<double>(d.background_errors));

    // Per partition: lag (kafka_exporter's labels), position, readiness.
    auto& lag = family("kstate_consumergroup_lag",
                       "High watermark minus the next offset applied, per partition held here", MetricType::Gauge);
    auto& pos =
        family("kstate_partition_position", "Next offset applied (the position answers report)", MetricType::Gauge);
    auto& hwm =
        family("kstate_partition_high_watermark", "The partition's high watermark as last fetched", MetricType::Gauge);
    auto& ready = family("kstate_partition_ready", "1 once the partition caught up after assignment (restored)",
                         MetricType::Gauge);
    auto& remaining = family("kstate_partition_restore_remaining_records",
                             "Records still to apply before the partition is ready (0 when ready)", MetricType::Gauge);
    auto& eta =
        family("kstate_partition_restore_eta_seconds",
               "Seconds until a partition catching up is ready, at its rate since the assignment", MetricType::Gauge);
    const auto now = std::chrono::steady_clock::now();
    std::set<std::string> topics;
    for (const auto& v : views_) topics.insert(v.topic);
    for (const auto& topic : topics) {
      auto t = ownership_.topic(topic);
      if (!t) continue;
      for (const auto& [p, st] : t->partitions) {
        if (!st.assigned) continue;
        std::vector<ClientMetric::Label> l{
            {"consumergroup", group_}, {"topic", topic}, {"partition", std::to_string(p)}};
        if (st.applied >= 0) gauge(pos, l, static_cast<double>(st.applied));
        if (st.high_watermark >= 0) gauge(hwm, l, static_cast<double>(st.high_watermark));
        if (st.applied >= 0 && st.high_watermark >= 0)
          gauge(lag, l, static_cast<double>(std::max<int64_t>(0, st.high_watermark - st.applied)));
        gauge(ready, l, st.ready ? 1 : 0);
        double left = 0;
        if (!st.ready && st.catch_up_target >= 0)
          left = static_cast<double>(std::max<int64_t>(0, st.catch_up_target - std::max<int64_t>(0, st.applied)));
        gauge(remaining, l, left);
        if (auto c = catch_up(st, now); c && c->eta_seconds) gauge(eta, l, *c->eta_seconds);
      }
    }
    return {std::make_move_iterator(families.begin()), std::make_move_iterator(families.end())};
  }

 private:
  const storage::db& db_;
  const std::vector<view_def>& views_;
  const ownership_registry& ownership_;
  std::string group_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> make_state_metrics(const storage::db& db, const std::vector<view_def>& views,
                                                            const ownership_registry& ownership,
                                                            std::string consumer_group) {
  return std::make_shared<state_metrics>(db, views, ownership, std::move(consumer_group));
}

}  // namespace kstate::server
