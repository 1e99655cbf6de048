// The aggregate pipeline's side of an assignment: where each input partition resumes,
// and the changelog restore that first brings a store behind the group's committed
// offset up to it (docs/exactly-once.md).
#include "agg_pipeline.h"

#include "kafka_common.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "core/value_codec.h"

namespace kstate::ingest {

result<std::optional<int64_t>> agg_pipeline::plan_assign(const std::string& topic, int32_t partition) {
  // The group's committed offset: under exactly_once it moved atomically with the
  // outputs of every committed transaction, so it is where this input resumes.
  tpl_ptr list(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), partition);
  rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
  for (int attempt = 0; attempt < 60; ++attempt) {
    err = rd_kafka_committed(consumer_, list.get(), 10'000);
    if (!err) err = list->elems[0].err;
    if (!err) break;
    log()->warn("committed offset of {}-{}: {}; retrying", topic, partition, rd_kafka_err2str(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (err)
    return status::unavailable("reading the committed offset of " + topic + "-" + std::to_string(partition) + ": " +
                               rd_kafka_err2str(err));
  std::optional<int64_t> committed;
  if (list->elems[0].offset >= 0) committed = list->elems[0].offset;

  std::optional<int64_t> resume = committed;
  if (auto it = stage2_.find(topic); it != stage2_.end()) {
    for (size_t idx : it->second) {
      auto& v = views_[idx];
      auto local = db_.stored_position(v.id, partition);
      if (!local.ok()) return local.error();
      auto changelog = db_.stored_named_position(changelog_position_name(*v.def), partition);
      if (!changelog.ok()) return changelog.error();
      if (v.def->windowed()) {
        auto st = db_.stored_named_position(stream_time_name(*v.def), partition);
        if (!st.ok()) return st.error();
        stream_time_[{idx, partition}] = stream_time_committed_[{idx, partition}] = st.value().value_or(-1);
      }
      std::optional<int64_t> local_input = local.value();
      if (!committed) {
        // Nothing was ever committed for this input, so no committed transaction wrote
        // the changelog either: the local store (if any) is the whole truth.
        if (local_input) resume = resume ? std::min(*resume, *local_input) : *local_input;
        log()->info("{}-{}: no committed offset; store {} resumes at {}", topic, partition, v.def->name,
                    local_input ? std::to_string(*local_input) : std::string("the beginning"));
        continue;
      }
      if (local_input && *local_input == *committed) {
        log()->info("{}-{}: store {} is at the committed offset {}; no restore", topic, partition, v.def->name,
                    *committed);
        continue;
      }
      int64_t from = changelog.value().value_or(0);
      log()->info("{}-{}: store {} is at input {} (committed {}): catching up from changelog {}-{} at {}", topic,
                  partition, v.def->name, local_input ? std::to_string(*local_input) : std::string("none"), *committed,
                  v.def->changelog_topic, partition, from);
      planned_.push_back(planned{idx, partition, from, committed});
    }
  }
  auto key = std::make_pair(topic, partition);
  committed_[key] = resume.value_or(0);
  return resume;
}

result<bool> agg_pipeline::restore_planned(const std::atomic<bool>& running) {
  auto plans = std::move(planned_);
  planned_.clear();
  for (const auto& p : plans) {
    auto done = restore(views_[p.view], p.partition, p.from, p.resume, running);
    if (!done.ok() || !*done) return done;
  }
  return true;
}

result<bool> agg_pipeline::restore(view_state& v, int32_t partition, int64_t from, std::optional<int64_t> input_resume,
                                   const std::atomic<bool>& running) {
  const auto& def = *v.def;
  const auto& cl = def.changelog_topic;
  auto started = std::chrono::steady_clock::now();
  int64_t low = 0, high = 0;
  // With isolation.level=read_committed the high mark is the last stable offset.
  auto werr = rd_kafka_query_watermark_offsets(restorer_, cl.c_str(), partition, &low, &high, 10'000);
  if (werr)
    return status::unavailable("watermarks of " + cl + "-" + std::to_string(partition) + ": " + rd_kafka_err2str(werr));
  from = std::max(from, low);
  int64_t total = std::max<int64_t>(0, high - from);
  ownership_.update_restore(def.topic, partition, 0, total);
  uint64_t applied = 0;
  int64_t end = from;
  auto batch = db_.new_batch();
  const size_t idx = static_cast<size_t>(&v - views_.data());
  int64_t stream_time = -1;
  if (def.windowed()) {
    auto st = db_.stored_named_position(stream_time_name(def), partition);
    if (!st.ok()) return st.error();
    stream_time = st.value().value_or(-1);
  }
  if (from < high) {
    tpl_ptr list(rd_kafka_topic_partition_list_new(1));
    rd_kafka_topic_partition_list_add(list.get(), cl.c_str(), partition)->offset = from;
    if (auto e = rd_kafka_assign(restorer_, list.get()))
      return status::unavailable("assigning " + cl + ": " + rd_kafka_err2str(e));
    for (;;) {
      if (!running) {
        // A stop: what was applied stays, with the changelog position it reached (the
        // input position is not written, so the next start restores the rest).
        batch.set_named_position(changelog_position_name(def), partition, end);
        if (def.windowed()) batch.set_named_position(stream_time_name(def), partition, stream_time);
        if (auto s = db_.write(batch); !s.ok()) return s;
        if (auto e = rd_kafka_assign(restorer_, nullptr)) log()->warn("unassigning {}: {}", cl, rd_kafka_err2str(e));
        log()->info("stopping: restore of {}-{} into store {} left at offset {} of {}", cl, partition, def.name, end,
                    high);
        return false;
      }
      rd_kafka_message_t* m = rd_kafka_consumer_poll(restorer_, 100);
      if (!m) continue;
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        end = std::max(end, m->offset);
        rd_kafka_message_destroy(m);
        break;
      }
      if (m->err) {
        std::string why = rd_kafka_message_errstr(m);
        bool fatal = m->err == RD_KAFKA_RESP_ERR__FATAL;
        rd_kafka_message_destroy(m);
        if (fatal) return status::unavailable("restoring " + cl + ": " + why);
        log()->warn("restoring {}-{}: {}", cl, partition, why);
        continue;
      }
      int64_t framed_offset = m->offset;
      rd_kafka_headers_t* hdrs = nullptr;
      if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const void* val = nullptr;
        size_t len = 0;
        if (rd_kafka_header_get_last(hdrs, changelog_offset_header, &val, &len) == RD_KAFKA_RESP_ERR_NO_ERROR && val)
          framed_offset = std::strtoll(std::string(static_cast<const char*>(val), len).c_str(), nullptr, 10);
      }
      std::string_view key(static_cast<const char*>(m->key), m->key ? m->key_len : 0);
      // A windowed changelog record carries the event time of its update; the largest
      // is the partition's stream time.
      if (def.windowed()) stream_time = std::max(stream_time, rd_kafka_message_timestamp(m, nullptr));
      if (m->payload)
        batch.put(v.id, partition, key, frame_value(framed_offset, {static_cast<const char*>(m->payload), m->len}));
      else batch.del(v.id, partition, key);
      end = m->offset + 1;
      ++applied;
      rd_kafka_message_destroy(m);
      if (applied % 10'000 == 0) {
        // Progress is durable in steps: a crash mid-restore resumes from here.
        batch.set_named_position(changelog_position_name(def), partition, end);
        if (auto s = db_.write(batch); !s.ok()) return s;
        batch.clear();
        ownership_.update_restore(def.topic, partition, end - from, total);
      }
    }
    if (auto e = rd_kafka_assign(restorer_, nullptr)) log()->warn("unassigning {}: {}", cl, rd_kafka_err2str(e));
  }
  batch.set_named_position(changelog_position_name(def), partition, end);
  if (def.windowed()) {
    batch.set_named_position(stream_time_name(def), partition, stream_time);
    stream_time_[{idx, partition}] = stream_time_committed_[{idx, partition}] = stream_time;
  }
  if (input_resume) batch.set_position(v.id, partition, *input_resume);
  if (auto s = db_.write(batch); !s.ok()) return s;
  ownership_.update_restore(def.topic, partition, end - from, total);
  restored_total_ += applied;
  if (m_restored_)
    m_restored_->Add({{"store", def.name}, {"partition", std::to_string(partition)}})
        .Increment(static_cast<double>(applied));
  log()->info("restored {} records of {}-{} (offsets {}..{}) into store {} in {} ms; input resumes at {}", applied, cl,
              partition, from, end, def.name,
              std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count(),
              input_resume ? std::to_string(*input_resume) : std::string("the beginning"));
  return true;
}

}  // namespace kstate::ingest
