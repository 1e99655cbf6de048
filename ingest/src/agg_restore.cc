// The aggregate pipeline's side of an assignment: where each input partition resumes,
// and the changelog restore that first brings a store behind the group's committed
// offset up to it (docs/exactly-once.md).
#include "agg_pipeline.h"

#include "changelog_apply.h"
#include "kafka_common.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <thread>

namespace kstate::ingest {

std::optional<int64_t> changelog_header_number(const rd_kafka_message_t* m, const char* name) {
  rd_kafka_headers_t* hdrs = nullptr;
  if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR) return std::nullopt;
  const void* val = nullptr;
  size_t len = 0;
  if (rd_kafka_header_get_last(hdrs, name, &val, &len) != RD_KAFKA_RESP_ERR_NO_ERROR || !val) return std::nullopt;
  const char* text = static_cast<const char*>(val);
  int64_t out = 0;
  auto [end, ec] = std::from_chars(text, text + len, out);
  if (ec != std::errc() || end != text + len) return std::nullopt;
  return out;
}

int64_t changelog_record_offset(const rd_kafka_message_t* m, int64_t fallback) {
  auto n = changelog_header_number(m, changelog_offset_header);
  return n && *n >= 0 ? *n : fallback;
}

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
      planned_.push_back(planned{idx, topic, partition, from, committed});
    }
  }
  auto key = std::make_pair(topic, partition);
  committed_[key] = resume.value_or(0);
  return resume;
}

bool agg_pipeline::restoring(const std::string& topic, int32_t partition) const {
  if (active_ && active_->plan.topic == topic && active_->plan.partition == partition) return true;
  for (const auto& p : planned_)
    if (p.topic == topic && p.partition == partition) return true;
  return false;
}

status agg_pipeline::begin_restore(const planned& p) {
  auto& v = views_[p.view];
  const auto& def = *v.def;
  const auto& cl = def.changelog_topic;
  active_.emplace(p, db_.new_batch());
  auto& a = *active_;
  a.started = std::chrono::steady_clock::now();
  int64_t low = 0, high = 0;
  // With isolation.level=read_committed the high mark is the last stable offset.
  auto werr = rd_kafka_query_watermark_offsets(restorer_, cl.c_str(), p.partition, &low, &high, 10'000);
  if (werr)
    return status::unavailable("watermarks of " + cl + "-" + std::to_string(p.partition) + ": " +
                               rd_kafka_err2str(werr));
  a.from = a.end = std::max(p.from, low);
  a.high = high;
  ownership_.update_restore(def.topic, p.partition, 0, std::max<int64_t>(0, high - a.from));
  if (def.windowed()) {
    auto st = db_.stored_named_position(stream_time_name(def), p.partition);
    if (!st.ok()) return st.error();
    a.stream_time = st.value().value_or(-1);
  }
  if (a.from < a.high) {
    tpl_ptr list(rd_kafka_topic_partition_list_new(1));
    rd_kafka_topic_partition_list_add(list.get(), cl.c_str(), p.partition)->offset = a.from;
    if (auto e = rd_kafka_assign(restorer_, list.get()))
      return status::unavailable("assigning " + cl + ": " + rd_kafka_err2str(e));
  }
  return status::ok_status();
}

status agg_pipeline::checkpoint_restore(bool done) {
  auto& a = *active_;
  const size_t idx = a.plan.view;
  const auto& def = *views_[idx].def;
  a.batch.set_named_position(changelog_position_name(def), a.plan.partition, a.end);
  if (def.windowed()) a.batch.set_named_position(stream_time_name(def), a.plan.partition, a.stream_time);
  if (done && a.plan.resume) a.batch.set_position(views_[idx].id, a.plan.partition, *a.plan.resume);
  if (auto s = db_.write(a.batch); !s.ok()) return s;
  a.batch.clear();
  ownership_.update_restore(def.topic, a.plan.partition, a.end - a.from, std::max<int64_t>(0, a.high - a.from));
  if (!done) return status::ok_status();
  if (def.windowed())
    stream_time_[{idx, a.plan.partition}] = stream_time_committed_[{idx, a.plan.partition}] = a.stream_time;
  if (a.from < a.high)
    if (auto e = rd_kafka_assign(restorer_, nullptr))
      log()->warn("unassigning {}: {}", def.changelog_topic, rd_kafka_err2str(e));
  restored_total_ += a.applied;
  if (m_restored_)
    m_restored_->Add({{"store", def.name}, {"partition", std::to_string(a.plan.partition)}})
        .Increment(static_cast<double>(a.applied));
  log()->info(
      "restored {} records of {}-{} (offsets {}..{}) into store {} in {} ms; input resumes at {}", a.applied,
      def.changelog_topic, a.plan.partition, a.from, a.end, def.name,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - a.started).count(),
      a.plan.resume ? std::to_string(*a.plan.resume) : std::string("the beginning"));
  active_.reset();
  return status::ok_status();
}

status agg_pipeline::end_restore(bool stopping) {
  auto& a = *active_;
  const auto& def = *views_[a.plan.view].def;
  const auto& cl = def.changelog_topic;
  // What was applied stays, with the changelog position it reached (the input
  // position is not written, so the next owner, or the next start, restores the rest).
  if (auto s = checkpoint_restore(false); !s.ok()) return s;
  if (a.from < a.high)
    if (auto e = rd_kafka_assign(restorer_, nullptr)) log()->warn("unassigning {}: {}", cl, rd_kafka_err2str(e));
  log()->info("{}: restore of {}-{} into store {} left at offset {} of {}", stopping ? "stopping" : "revoked", cl,
              a.plan.partition, def.name, a.end, a.high);
  active_.reset();
  return status::ok_status();
}

status agg_pipeline::stop_restore() {
  planned_.clear();
  return active_ ? end_restore(true) : status::ok_status();
}

result<std::vector<std::pair<std::string, int32_t>>> agg_pipeline::restore_some(std::chrono::milliseconds budget,
                                                                                const std::atomic<bool>& running) {
  std::vector<std::pair<std::string, int32_t>> completed;
  const auto until = std::chrono::steady_clock::now() + budget;
  while (active_ || !planned_.empty()) {
    if (!active_) {
      auto p = std::move(planned_.front());
      planned_.pop_front();
      if (auto s = begin_restore(p); !s.ok()) return s;
    }
    auto& a = *active_;
    const auto& def = *views_[a.plan.view].def;
    const auto& cl = def.changelog_topic;
    if (!running) {
      if (auto s = stop_restore(); !s.ok()) return s;
      return completed;
    }
    bool at_end = a.end >= a.high;
    while (!at_end && std::chrono::steady_clock::now() < until && running) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(restorer_, 20);
      if (!m) {
        // Past the last record only transaction markers may remain, which deliver
        // nothing: the consumer's position passing the end says the restore is complete.
        tpl_ptr at(rd_kafka_topic_partition_list_new(1));
        rd_kafka_topic_partition_list_add(at.get(), cl.c_str(), a.plan.partition);
        if (rd_kafka_position(restorer_, at.get()) == RD_KAFKA_RESP_ERR_NO_ERROR && at->elems[0].offset >= a.high) {
          a.end = std::max(a.end, at->elems[0].offset);
          at_end = true;
        }
        continue;
      }
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        a.end = std::max(a.end, m->offset);
        rd_kafka_message_destroy(m);
        at_end = true;
        break;
      }
      if (m->err) {
        std::string why = rd_kafka_message_errstr(m);
        bool fatal = m->err == RD_KAFKA_RESP_ERR__FATAL;
        rd_kafka_message_destroy(m);
        if (fatal) return status::unavailable("restoring " + cl + ": " + why);
        log()->warn("restoring {}-{}: {}", cl, a.plan.partition, why);
        continue;
      }
      apply_changelog_record(a.batch, target(views_[a.plan.view]), a.plan.partition, m, a.stream_time);
      a.end = m->offset + 1;
      ++a.applied;
      rd_kafka_message_destroy(m);
      // At the end known when the restore began: done, without waiting for the
      // end-of-partition event (up to a fetch wait later). A tail of transaction markers
      // delivers no record: the end-of-partition event ends those.
      if (a.end >= a.high) at_end = true;
      // Progress is durable in steps: a crash mid-restore resumes from here.
      if (a.applied % 10'000 == 0)
        if (auto s = checkpoint_restore(false); !s.ok()) return s;
    }
    if (!at_end) {
      if (!running)
        if (auto s = stop_restore(); !s.ok()) return s;
      return completed;  // out of time: the next call goes on
    }
    auto topic = a.plan.topic;
    auto partition = a.plan.partition;
    if (auto s = checkpoint_restore(true); !s.ok()) return s;
    if (!restoring(topic, partition)) completed.emplace_back(std::move(topic), partition);
    if (std::chrono::steady_clock::now() >= until) break;
  }
  return completed;
}

}  // namespace kstate::ingest
