// The aggregate pipeline's topic administration: creates the repartition and changelog
// topics it needs (an existing one is kept) and checks their partition counts.
#include "agg_pipeline.h"

#include "kafka_common.h"

#include <chrono>
#include <thread>

namespace kstate::ingest {

status agg_pipeline::create_topics() {
  // Wanted topics with their partition counts.
  struct wanted {
    std::string name;
    int32_t partitions;
    int replication;
    bool compact;
    const view_def* def;
  };
  std::vector<wanted> want;
  for (const auto& vs : views_) {
    const auto& v = *vs.def;
    int32_t source_count = ownership_.partition_count(v.input_topic());
    if (source_count <= 0) return status::not_found("topic '" + v.input_topic() + "' does not exist");
    if (v.is_join()) {
      // Checked before anything is created: a join of inputs that are not co-partitioned
      // would pair records of different keys' partitions.
      if (auto s = check_join_topics({}); !s.ok()) return s;
    }
    int32_t store_count = source_count;
    if (v.rekeyed()) {
      store_count = v.repartition_partitions > 0 ? v.repartition_partitions : source_count;
      want.push_back({v.repartition_topic, store_count, v.replication_factor, false, &v});
    }
    want.push_back({v.changelog_topic, store_count, v.replication_factor, true, &v});
  }
  std::vector<rd_kafka_NewTopic_t*> news;
  for (const auto& w : want) {
    char err[512];
    auto* nt = rd_kafka_NewTopic_new(w.name.c_str(), w.partitions, w.replication, err, sizeof err);
    if (!nt) return status::invalid_argument("topic '" + w.name + "': " + err);
    if (w.compact) {
      // compact, or compact,delete for a windowed view that asked for it (config.cc checks).
      if (!w.def->changelog_configs.count("cleanup.policy") &&
          rd_kafka_NewTopic_set_config(nt, "cleanup.policy", "compact"))
        return status::invalid_argument("cleanup.policy");
      for (const auto& [k, val] : w.def->changelog_configs)
        if (rd_kafka_NewTopic_set_config(nt, k.c_str(), val.c_str()))
          return status::invalid_argument("changelog config '" + k + "'");
    }
    news.push_back(nt);
  }
  rd_kafka_queue_t* q = rd_kafka_queue_new(producer_);
  rd_kafka_CreateTopics(producer_, news.data(), news.size(), nullptr, q);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, static_cast<int>(cfg_.startup_timeout.count()));
  status result = status::ok_status();
  if (!ev) {
    result = status::unavailable("creating repartition/changelog topics timed out");
  } else if (rd_kafka_event_error(ev)) {
    result = status::unavailable(std::string("creating topics: ") + rd_kafka_event_error_string(ev));
  } else {
    size_t cnt = 0;
    const auto* res = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &cnt);
    for (size_t i = 0; i < cnt; ++i) {
      auto e = rd_kafka_topic_result_error(res[i]);
      if (e == RD_KAFKA_RESP_ERR_NO_ERROR) log()->info("created topic {}", rd_kafka_topic_result_name(res[i]));
      else if (e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
        result = status::unavailable(std::string("creating topic ") + rd_kafka_topic_result_name(res[i]) + ": " +
                                     rd_kafka_topic_result_error_string(res[i]));
    }
  }
  if (ev) rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  for (auto* nt : news) rd_kafka_NewTopic_destroy(nt);
  if (!result.ok()) return result;

  // Wait until metadata shows every topic with its partitions, then publish the counts.
  auto deadline = std::chrono::steady_clock::now() + cfg_.startup_timeout;
  for (;;) {
    const rd_kafka_metadata_t* md = nullptr;
    std::map<std::string, int32_t> counts;
    if (rd_kafka_metadata(producer_, 1, nullptr, &md, 2000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      for (int i = 0; i < md->topic_cnt; ++i)
        if (md->topics[i].err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topics[i].partition_cnt > 0)
          counts[md->topics[i].topic] = md->topics[i].partition_cnt;
      rd_kafka_metadata_destroy(md);
    }
    bool all = true;
    for (const auto& w : want)
      if (!counts.count(w.name)) all = false;
    if (all) {
      if (auto s = check_join_topics(counts); !s.ok()) return s;
      for (const auto& vs : views_) {
        const auto& v = *vs.def;
        if (v.rekeyed()) ownership_.set_partition_count(v.topic, counts[v.topic]);
        if (counts[v.changelog_topic] < ownership_.partition_count(v.topic))
          return status::invalid_argument("changelog topic '" + v.changelog_topic + "' has " +
                                          std::to_string(counts[v.changelog_topic]) + " partitions, fewer than '" +
                                          v.topic + "' (" + std::to_string(ownership_.partition_count(v.topic)) + ")");
      }
      return status::ok_status();
    }
    if (std::chrono::steady_clock::now() > deadline)
      return status::unavailable("created topics did not appear in metadata");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace kstate::ingest
