#include "agg_pipeline.h"

#include "kafka_common.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "core/value_codec.h"
#include "ingest/partitioner.h"
#include "metrics.h"

namespace kstate::ingest {

void agg_delivery_report(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  auto* self = static_cast<agg_pipeline*>(opaque);
  if (m->err) {
    if (!self->delivery_error_) self->delivery_error_ = m->err;
    log()->warn("delivery to {}-{} failed: {}", rd_kafka_topic_name(m->rkt), m->partition, rd_kafka_err2str(m->err));
    return;
  }
  // Only changelog positions matter; message opaque is non-null for changelog records.
  if (!m->_private) return;
  auto& end = self->delivered_end_[{rd_kafka_topic_name(m->rkt), m->partition}];
  end = std::max(end, m->offset + 1);
}

agg_pipeline::agg_pipeline(const ingest_config& cfg, storage::db& db, ownership_registry& ownership,
                           batch_builder& builder)
    : cfg_(cfg), db_(db), ownership_(ownership), builder_(builder), exactly_once_(cfg.exactly_once) {}

result<std::unique_ptr<agg_pipeline>> agg_pipeline::create(const ingest_config& cfg,
                                                           const std::vector<const view_def*>& views, storage::db& db,
                                                           ownership_registry& ownership, batch_builder& builder,
                                                           prometheus::Registry* metrics) {
  std::unique_ptr<agg_pipeline> p(new agg_pipeline(cfg, db, ownership, builder));
  for (const auto* v : views) {
    auto id = db.find_view(v->name);
    if (!id) return status::internal("view '" + v->name + "' has no column family");
    p->views_.push_back(view_state{v, *id, aggregator(*v, cfg.max_json_depth), std::nullopt, std::nullopt});
    if (v->is_join()) {
      auto sides = db.find_view(join_sides_name(*v));
      if (!sides) return status::internal("join view '" + v->name + "' has no column family for its sides");
      p->views_.back().sides = *sides;
      p->views_.back().join.emplace(*v, cfg.max_json_depth);
      if (v->is_fk_join()) {
        auto route = make_partitioner(v->join->right_partitioner);
        if (!route) return status::invalid_argument("join view '" + v->name + "': unknown right_partitioner");
        p->views_.back().fk_route = *route;
      }
    }
  }
  for (size_t i = 0; i < p->views_.size(); ++i) {
    const auto& v = *p->views_[i].def;
    if (v.rekeyed()) {
      p->stage1_[v.input_topic()].push_back(i);
      p->topics_.insert(v.input_topic());
    }
    if (v.is_join() && v.join->right_topic != v.input_topic()) {
      p->stage1_[v.join->right_topic].push_back(i);
      p->topics_.insert(v.join->right_topic);
    }
    p->stage2_[v.topic].push_back(i);
    p->topics_.insert(v.topic);
  }
  // A foreign-key join's right side: a view of its own, on the subscription topic.
  const size_t joins = p->views_.size();
  for (size_t i = 0; i < joins; ++i) {
    const auto& v = *p->views_[i].def;
    if (!v.is_fk_join()) continue;
    auto& right = p->fk_right_defs_.emplace_back(fk_right_view(v));
    auto id = db.find_view(right.name);
    if (!id) return status::internal("join view '" + v.name + "' has no column family for its right side");
    p->views_.push_back(view_state{&right, *id, aggregator(right, cfg.max_json_depth), std::nullopt, std::nullopt});
    p->views_.back().right_of = i;
    p->stage2_[right.topic].push_back(p->views_.size() - 1);
    p->topics_.insert(right.topic);
  }
  p->murmur2_ = *make_partitioner("murmur2");
  if (metrics) {
    p->m_restored_ = &counter_family(*metrics, "kstate_restore_records_total",
                                     "Changelog records applied to a local store (restores)");
    p->m_late_ = &counter_family(*metrics, "kstate_ingest_late_records_total",
                                 "Records of windowed stores dropped because every window they fall in had closed");
    p->m_txn_ = &counter_family(*metrics, "kstate_ingest_transactions_total",
                                "Aggregate batches made durable in Kafka, by outcome");
    p->m_future_ = &counter_family(*metrics, "kstate_ingest_future_records_total",
                                   "Records of windowed stores rejected because their event time was more than "
                                   "window.max_future ahead of the clock");
    p->m_unmatched_ = &counter_family(*metrics, "kstate_join_unmatched_records_total",
                                      "Left records of foreign-key joins whose value names no right key, by reason "
                                      "(missing: no such field or null; not_a_key: not a string or number; "
                                      "not_json: the value is not JSON)");
  }
  return p;
}

agg_pipeline::~agg_pipeline() { close(); }

status agg_pipeline::start(rd_kafka_t* consumer, std::set<std::string>& subscribe) {
  consumer_ = consumer;
  if (exactly_once_ && cfg_.instance_id.empty()) return status::invalid_argument("exactly_once needs an instance id");
  auto producer = create_client(cfg_, aggregate_producer_spec(cfg_), [this](rd_kafka_conf_t* conf) {
    rd_kafka_conf_set_opaque(conf, this);
    rd_kafka_conf_set_dr_msg_cb(conf, agg_delivery_report);
  });
  if (!producer.ok()) return producer.error();
  producer_ = producer.value().release();
  auto restorer = create_client(cfg_, restore_consumer_spec(cfg_));
  if (!restorer.ok()) return restorer.error();
  restorer_ = restorer.value().release();
  if (auto s = create_topics(); !s.ok()) return s;
  if (exactly_once_) {
    // Fences a previous incarnation with the same transactional.id and aborts the
    // transaction it left open, so read_committed readers need not wait for its timeout.
    for (;;) {
      error_ptr e(rd_kafka_init_transactions(producer_, static_cast<int>(cfg_.startup_timeout.count())));
      if (!e) break;
      if (rd_kafka_error_is_retriable(e.get())) {
        log()->warn("init_transactions: {}; retrying", rd_kafka_error_string(e.get()));
        continue;
      }
      return status::unavailable(std::string("init_transactions: ") + rd_kafka_error_string(e.get()));
    }
  }
  for (const auto& t : topics_) subscribe.insert(t);
  log()->info("{} aggregate view(s), {}", views_.size(), exactly_once_ ? "exactly_once" : "at_least_once");
  return status::ok_status();
}

status agg_pipeline::forget(const std::string& topic, int32_t partition) {
  std::erase_if(planned_, [&](const planned& p) { return p.topic == topic && p.partition == partition; });
  if (active_ && active_->plan.topic == topic && active_->plan.partition == partition)
    if (auto s = end_restore(false); !s.ok()) return s;
  if (auto it = stage2_.find(topic); it != stage2_.end())
    for (size_t idx : it->second) {
      stream_time_.erase({idx, partition});
      stream_time_committed_.erase({idx, partition});
    }
  committed_.erase({topic, partition});
  consumed_.erase({topic, partition});
  return status::ok_status();
}

void agg_pipeline::begin_if_needed() {
  if (!exactly_once_ || in_txn_) return;
  error_ptr e(rd_kafka_begin_transaction(producer_));
  // begin_transaction fails only on a programming or fatal error; commit() sees it.
  if (e) log()->error("begin_transaction: {}", rd_kafka_error_string(e.get()));
  in_txn_ = true;
}

status agg_pipeline::produce_changelog(const view_state& v, int32_t partition, const std::string& key,
                                       const cached& c) {
  return produce(v.def->changelog_topic, partition, key, c.deleted ? std::nullopt : changelog_value(v, c.state),
                 c.input_offset, c.timestamp, c.deleted ? std::nullopt : c.last);
}

status agg_pipeline::produce(const std::string& topic, int32_t partition, std::string_view key,
                             std::optional<std::string_view> value, int64_t input_offset, int64_t timestamp,
                             std::optional<int64_t> last) {
  // 0 lets the producer stamp the record with the current time.
  const int64_t ts = timestamp > 0 ? timestamp : 0;
  begin_if_needed();
  auto off = std::to_string(input_offset);
  bool changelog = input_offset >= 0;
  char* vptr = value ? const_cast<char*>(value->data()) : nullptr;
  size_t vlen = value ? value->size() : 0;
  for (;;) {
    rd_kafka_resp_err_t err;
    if (changelog && last) {
      const auto last_text = std::to_string(*last);
      err = rd_kafka_producev(
          producer_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(partition),
          RD_KAFKA_V_KEY(key.data(), key.size()), RD_KAFKA_V_VALUE(vptr, vlen), RD_KAFKA_V_TIMESTAMP(ts),
          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
          RD_KAFKA_V_HEADER(changelog_offset_header, off.data(), static_cast<ssize_t>(off.size())),
          RD_KAFKA_V_HEADER(changelog_last_header, last_text.data(), static_cast<ssize_t>(last_text.size())),
          RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(1)), RD_KAFKA_V_END);
    } else if (changelog) {
      err = rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(partition),
                              RD_KAFKA_V_KEY(key.data(), key.size()), RD_KAFKA_V_VALUE(vptr, vlen),
                              RD_KAFKA_V_TIMESTAMP(ts), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                              RD_KAFKA_V_HEADER(changelog_offset_header, off.data(), static_cast<ssize_t>(off.size())),
                              RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(1)), RD_KAFKA_V_END);
    } else {
      err = rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(partition),
                              RD_KAFKA_V_KEY(key.data(), key.size()), RD_KAFKA_V_VALUE(vptr, vlen),
                              RD_KAFKA_V_TIMESTAMP(ts), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    }
    if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      rd_kafka_poll(producer_, 10);
      continue;
    }
    if (err) {
      if (!delivery_error_) delivery_error_ = err;
      return status::unavailable("producing to " + topic + ": " + rd_kafka_err2str(err));
    }
    return status::ok_status();
  }
}

result<std::optional<std::string>> agg_pipeline::current(view_state& v, int32_t partition, const std::string& key) {
  auto got = db_.get(v.id, partition, key);
  if (!got.ok()) return got.error().prefixed("reading the aggregate of store " + v.def->name);
  if (!got.value().value) return std::optional<std::string>();
  auto f = unframe_value(*got.value().value);
  if (!f) return std::optional<std::string>();
  return std::optional<std::string>(std::string(f->value));
}

bool agg_pipeline::refuse_future(view_state& v, const record& r, int64_t ts) {
  const int64_t now =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  auto why = check_future(*v.def, ts, now);
  if (why.empty()) return false;
  if (m_future_) m_future_->Add({{"store", v.def->name}}).Increment();
  builder_.reject(*v.def, r, std::move(why));
  return true;
}

void agg_pipeline::stage1(view_state& v, const record& r) {
  std::vector<std::string> keys;
  auto why = group_keys(*v.def, r.key, r.value, cfg_.max_json_depth, keys);
  if (why.empty()) why = v.agg.check(r.value);
  if (!why.empty()) {
    builder_.reject(*v.def, r, std::move(why));
    return;
  }
  if (v.def->windowed()) {
    // An event time from the future is refused here, so the dead letter is the source
    // record. Other event-time problems are left to stage 2, which reads the time the
    // re-keyed record carries (the producer's clock when the source had none).
    int64_t ts = 0;
    if (event_time(*v.def, r.value, r.timestamp, cfg_.max_json_depth, ts).empty() && refuse_future(v, r, ts)) return;
  }
  if (!v.def->windowed()) {
    // Combined: one repartition record per key and batch, produced at commit().
    const size_t idx = static_cast<size_t>(&v - views_.data());
    for (auto& k : keys) {
      auto it = partials_.try_emplace(std::make_pair(idx, std::move(k))).first;
      // The value was checked above: combining it cannot fail.
      (void)v.agg.combine(it->second, r.value, r.timestamp);
    }
    return;
  }
  // Windowed: one repartition record per source record and key, which carries the
  // input's timestamp (the event time, unless window.time_field names one in the value).
  // Words carry no value: stage 2 only counts them.
  const int32_t count = ownership_.partition_count(v.def->topic);
  const bool words = v.def->group_by == group_by_kind::words;
  for (const auto& k : keys) {
    auto s = words ? produce(v.def->topic, murmur2_(k, count), k, std::nullopt, -1, r.timestamp)
                   : produce(v.def->topic, murmur2_(k, count), k, r.value, -1, r.timestamp);
    if (!s.ok()) log()->error("{}", s.message());
  }
}

status agg_pipeline::stage2(view_state& v, const record& r) {
  std::string key;
  if (v.def->rekeyed()) {
    // Re-keyed by stage 1: the key is the group key. The repartition topic is written
    // by stage 1 but readable by anyone, so the bound is checked again.
    key = r.key ? std::string(*r.key) : std::string();
    if (auto why = check_group_key(*v.def, key, cfg_.max_json_depth); !why.empty()) {
      builder_.reject(*v.def, r, std::move(why));
      return status::ok_status();
    }
  } else {
    std::vector<std::string> keys;
    auto why = group_keys(*v.def, r.key, r.value, cfg_.max_json_depth, keys);
    if (!why.empty()) {
      builder_.reject(*v.def, r, std::move(why));
      return status::ok_status();
    }
    key = std::move(keys.front());
  }
  if (!v.def->windowed()) {
    auto folded = fold(v, r, key, r.timestamp);
    return folded.ok() ? status::ok_status() : folded.error();
  }
  int64_t ts = 0;
  if (auto why = event_time(*v.def, r.value, r.timestamp, cfg_.max_json_depth, ts); !why.empty()) {
    builder_.reject(*v.def, r, std::move(why));
    return status::ok_status();
  }
  // Before stream time moves: one record from the year 9999 would close every window.
  if (refuse_future(v, r, ts)) return status::ok_status();
  if (auto why = v.agg.check(r.value); !why.empty()) {
    builder_.reject(*v.def, r, std::move(why));
    return status::ok_status();
  }
  const size_t idx = static_cast<size_t>(&v - views_.data());
  int64_t& stream_time = stream_time_.try_emplace({idx, r.partition}, -1).first->second;
  stream_time = std::max(stream_time, ts);
  bool any = false;
  if (is_session(*v.def->window)) {
    bool late = false;
    auto folded = fold_session(v, r, key, ts, stream_time, late);
    if (!folded.ok()) return folded.error();
    if (!folded.value() && !late) return status::ok_status();  // rejected: counted once, by fold_session
    any = folded.value();
  }
  for (int64_t start : window_starts(*v.def->window, ts)) {
    // A window that closed (end + grace reached) takes no more records.
    if (window_closed(*v.def->window, start, stream_time)) continue;
    any = true;
    auto folded = fold(v, r, encode_windowed_key(key, start), ts);
    if (!folded.ok()) return folded.error();
    if (!folded.value()) return status::ok_status();  // rejected: counted once, by fold
  }
  if (!any) {
    ++late_total_;
    if (m_late_) m_late_->Add({{"store", v.def->name}}).Increment();
    log()->debug("{}-{}@{}: late for store {} (event time {}, stream time {}): dropped", r.topic, r.partition, r.offset,
                 v.def->name, ts, stream_time);
  } else {
    builder_.note_applied(v.def->name, r.topic, r.partition);
  }
  return status::ok_status();
}

result<bool> agg_pipeline::fold(view_state& v, const record& r, const std::string& key, int64_t timestamp) {
  size_t idx = static_cast<size_t>(&v - views_.data());
  auto slot = cache_.find({idx, r.partition, key});
  std::optional<std::string> cur;
  if (slot != cache_.end()) {
    cur = slot->second.state;
  } else if (auto u = unwritten_.find({idx, r.partition, key}); u != unwritten_.end()) {
    if (!u->second.deleted) cur = u->second.state;
  } else {
    auto stored = current(v, r.partition, key);
    if (!stored.ok()) return stored.error();
    cur = std::move(stored.value());
  }
  auto out = v.agg.apply(cur, r.value);
  if (!out.error.empty()) {
    builder_.reject(*v.def, r, std::move(out.error));
    return false;
  }
  if (slot == cache_.end()) slot = cache_.emplace(std::make_tuple(idx, r.partition, key), cached{}).first;
  slot->second.state = std::move(out.state);
  slot->second.input_offset = r.offset;
  // A window's changelog record carries the largest event time folded into it, not the
  // last: a restore takes the partition's stream time from these timestamps, and an
  // out-of-order record folded last must not set it back.
  slot->second.timestamp = v.def->windowed() ? std::max(slot->second.timestamp, timestamp) : timestamp;
  slot->second.dirty = true;
  if (!v.def->windowed()) builder_.note_applied(v.def->name, r.topic, r.partition);
  if (!v.def->cache) {
    auto s = produce_changelog(v, r.partition, key, slot->second);
    if (!s.ok()) log()->error("{}", s.message());
  }
  return true;
}

status agg_pipeline::add(const record& r) {
  auto tp = std::make_pair(std::string(r.topic), r.partition);
  auto c = committed_.find(tp);
  // Below the committed offset: already reflected (e.g. read again for a table view).
  if (c != committed_.end() && r.offset < c->second) return status::ok_status();
  if (auto it = stage1_.find(r.topic); it != stage1_.end())
    for (size_t idx : it->second) {
      if (views_[idx].join) join_stage1(views_[idx], r);
      else stage1(views_[idx], r);
    }
  if (auto it = stage2_.find(r.topic); it != stage2_.end())
    for (size_t idx : it->second) {
      auto& v = views_[idx];
      auto s = v.right_of   ? fk_right_stage2(v, r)
               : v.fk_route ? fk_left_stage2(v, r)
               : v.join     ? join_stage2(v, r)
                            : stage2(v, r);
      if (!s.ok()) return s;
    }
  consumed_[tp] = r.offset + 1;
  return status::ok_status();
}

agg_pipeline::outcome agg_pipeline::abort_and_rewind(std::string& error, const std::string& why) {
  log()->warn("aborting the batch's transaction: {}", why);
  if (exactly_once_ && in_txn_) {
    error_ptr e(rd_kafka_abort_transaction(producer_, -1));
    if (e) {
      error = "abort_transaction: " + std::string(rd_kafka_error_string(e.get()));
      return outcome::fatal;
    }
  }
  in_txn_ = false;
  cache_.clear();
  partials_.clear();
  join_partials_.clear();
  stream_time_ = stream_time_committed_;
  delivered_end_.clear();
  delivery_error_ = RD_KAFKA_RESP_ERR_NO_ERROR;
  // Read the batch's input again from the last committed offsets.
  tpl_ptr list(rd_kafka_topic_partition_list_new(static_cast<int>(consumed_.size())));
  for (const auto& [tp, next] : consumed_) {
    auto c = committed_.find(tp);
    rd_kafka_topic_partition_list_add(list.get(), tp.first.c_str(), tp.second)->offset =
        c == committed_.end() ? RD_KAFKA_OFFSET_BEGINNING : c->second;
  }
  consumed_.clear();
  if (m_txn_) m_txn_->Add({{"outcome", "aborted"}}).Increment();
  if (list->cnt > 0) {
    error_ptr e(rd_kafka_seek_partitions(consumer_, list.get(), 10'000));
    // A timeout is not a failed seek. rd_kafka_seek_partitions() raises each
    // partition's version barrier before it waits (records fetched before the seek are
    // dropped by the consumer from then on) and only waits for the fetchers to confirm;
    // a partition whose leader cannot be reached (a network cut) confirms when it is
    // reached again, and its records then start at the offset sought.
    if (e && rd_kafka_error_code(e.get()) == RD_KAFKA_RESP_ERR__TIMED_OUT) {
      log()->warn(
          "rewinding after an aborted transaction: {}; the rewind completes when the partitions' leaders "
          "are reached",
          rd_kafka_error_string(e.get()));
    } else if (e) {
      error = "rewinding after an aborted transaction: " + std::string(rd_kafka_error_string(e.get()));
      return outcome::fatal;
    }
  }
  return outcome::aborted;
}

void agg_pipeline::written(uint64_t sequence) {
  while (!unwritten_batches_.empty() && unwritten_batches_.front().first <= sequence) {
    const auto& [seq, keys] = unwritten_batches_.front();
    for (const auto& k : keys)
      // A later batch may have written the key again: then it stays.
      if (auto it = unwritten_.find(k); it != unwritten_.end() && it->second.sequence == seq) unwritten_.erase(it);
    unwritten_batches_.pop_front();
  }
}

agg_pipeline::outcome agg_pipeline::commit(storage::write_batch& batch, std::string& error, uint64_t sequence) {
  if (consumed_.empty()) return outcome::committed;
  // Stage 1's combined records: what the batch's records add up to, per key.
  for (const auto& [k, p] : partials_) {
    auto& v = views_[k.first];
    const int32_t partition = murmur2_(k.second, ownership_.partition_count(v.def->topic));
    auto s = produce(v.def->topic, partition, k.second, v.agg.encode(p), -1, p.timestamp);
    if (!s.ok()) return abort_and_rewind(error, s.message());
  }
  partials_.clear();
  // Join views' stage 1: the last record per key and side, to the same partition.
  for (const auto& [k, j] : join_partials_) {
    const auto& [idx, partition, key, side] = k;
    const auto& def = *views_[idx].def;
    // A foreign-key join's right records go to its subscription topic instead.
    const bool fk_right = def.is_fk_join() && side == join_side::right;
    auto s = fk_right ? produce(def.join->subscription_topic, partition, key,
                                encode_fk_message({fk_message_kind::right, {}, 0, -1, j.value}), -1, j.timestamp)
                      : produce(def.topic, partition, key, encode_join_input(side, j.value), -1, j.timestamp);
    if (!s.ok()) return abort_and_rewind(error, s.message());
  }
  join_partials_.clear();
  // Record cache: only the last update of each key in this batch goes to the changelog.
  for (auto& [k, c] : cache_) {
    auto& v = views_[std::get<0>(k)];
    if (!v.def->cache || !c.dirty) continue;
    auto s = produce_changelog(v, std::get<1>(k), std::get<2>(k), c);
    if (!s.ok()) return abort_and_rewind(error, s.message());
  }
  begin_if_needed();
  // Every record of the batch acknowledged (or failed) before anything is committed.
  while (rd_kafka_outq_len(producer_) > 0) rd_kafka_flush(producer_, 1000);
  if (delivery_error_) {
    auto err = delivery_error_;
    if (!exactly_once_ && rd_kafka_fatal_error(producer_, nullptr, 0) == RD_KAFKA_RESP_ERR_NO_ERROR)
      return abort_and_rewind(error, std::string("delivery failed: ") + rd_kafka_err2str(err));
    if (exactly_once_) {
      char buf[512];
      if (rd_kafka_fatal_error(producer_, buf, sizeof buf)) {
        error = std::string("fatal producer error: ") + buf;
        return outcome::fatal;
      }
      return abort_and_rewind(error, std::string("delivery failed: ") + rd_kafka_err2str(err));
    }
    error = std::string("fatal producer error: ") + rd_kafka_err2str(err);
    return outcome::fatal;
  }
  tpl_ptr offsets(rd_kafka_topic_partition_list_new(static_cast<int>(consumed_.size())));
  for (const auto& [tp, next] : consumed_)
    rd_kafka_topic_partition_list_add(offsets.get(), tp.first.c_str(), tp.second)->offset = next;
  if (exactly_once_) {
    auto handle = [&](rd_kafka_error_t* raw, const char* what) -> std::optional<outcome> {
      error_ptr e(raw);
      if (!e) return std::nullopt;
      std::string msg = std::string(what) + ": " + rd_kafka_error_string(e.get());
      if (rd_kafka_error_is_fatal(e.get())) {
        error = msg;
        return outcome::fatal;
      }
      return abort_and_rewind(error, msg);
    };
    std::unique_ptr<rd_kafka_consumer_group_metadata_t, void (*)(rd_kafka_consumer_group_metadata_t*)> md(
        rd_kafka_consumer_group_metadata(consumer_), rd_kafka_consumer_group_metadata_destroy);
    for (;;) {
      rd_kafka_error_t* e = rd_kafka_send_offsets_to_transaction(producer_, offsets.get(), md.get(), -1);
      if (e && rd_kafka_error_is_retriable(e)) {
        rd_kafka_error_destroy(e);
        continue;
      }
      if (auto o = handle(e, "send_offsets_to_transaction")) return *o;
      break;
    }
    for (;;) {
      rd_kafka_error_t* e = rd_kafka_commit_transaction(producer_, -1);
      if (e && rd_kafka_error_is_retriable(e)) {
        rd_kafka_error_destroy(e);
        continue;
      }
      if (auto o = handle(e, "commit_transaction")) return *o;
      break;
    }
    in_txn_ = false;
  } else {
    auto err = rd_kafka_commit(consumer_, offsets.get(), 0);
    if (err) return abort_and_rewind(error, std::string("committing offsets: ") + rd_kafka_err2str(err));
  }
  if (m_txn_) m_txn_->Add({{"outcome", "committed"}}).Increment();
  // Durable in Kafka: now the same updates and positions go to RocksDB in the engine's
  // batch. A crash before that write is caught up from the changelog on restart.
  std::vector<std::tuple<size_t, int32_t, std::string>> keys;
  for (auto& [k, c] : cache_) {
    if (!c.dirty) continue;
    const auto& v = views_[std::get<0>(k)];
    if (v.fk_route) fk_left_write(batch, v, std::get<1>(k), std::get<2>(k), c.state, c.input_offset);
    else if (v.join) join_write(batch, v, std::get<1>(k), std::get<2>(k), c.state, c.input_offset);
    else if (v.right_of && !c.deleted) batch.put(v.id, std::get<1>(k), std::get<2>(k), c.state);
    else if (c.deleted) batch.del(v.id, std::get<1>(k), std::get<2>(k));
    else if (c.last) batch.put(v.id, std::get<1>(k), std::get<2>(k), frame_value(c.input_offset, *c.last, c.state));
    else batch.put(v.id, std::get<1>(k), std::get<2>(k), frame_value(c.input_offset, c.state));
    keys.push_back(k);
    unwritten_[k] = unwritten{sequence, std::move(c.state), c.last, c.deleted};
  }
  if (!keys.empty()) unwritten_batches_.emplace_back(sequence, std::move(keys));
  for (const auto& [tp, next] : consumed_) {
    auto it = stage2_.find(tp.first);
    if (it == stage2_.end()) continue;
    for (size_t idx : it->second) {
      auto& v = views_[idx];
      batch.set_position(v.id, tp.second, next);
      auto d = delivered_end_.find({v.def->changelog_topic, tp.second});
      if (d != delivered_end_.end()) batch.set_named_position(changelog_position_name(*v.def), tp.second, d->second);
    }
  }
  for (const auto& [vp, t] : stream_time_) {
    auto& committed = stream_time_committed_[vp];
    if (committed == t) continue;
    committed = t;
    batch.set_named_position(stream_time_name(*views_[vp.first].def), vp.second, t);
  }
  for (const auto& [tp, next] : consumed_) committed_[tp] = next;
  cache_.clear();
  delivered_end_.clear();
  return outcome::committed;
}

std::map<std::pair<std::string, int32_t>, int64_t> agg_pipeline::take_consumed() {
  auto out = std::move(consumed_);
  consumed_.clear();
  return out;
}

void agg_pipeline::poll() {
  if (producer_) rd_kafka_poll(producer_, 0);
}

bool agg_pipeline::producer_failed() const {
  return producer_ && rd_kafka_fatal_error(producer_, nullptr, 0) != RD_KAFKA_RESP_ERR_NO_ERROR;
}

void agg_pipeline::close() {
  if (producer_) {
    if (in_txn_) {
      error_ptr e(rd_kafka_abort_transaction(producer_, 5000));
      if (e) log()->warn("aborting the open transaction at shutdown: {}", rd_kafka_error_string(e.get()));
      in_txn_ = false;
    }
    if (rd_kafka_flush(producer_, 10'000)) log()->warn("aggregate producer: undelivered records at shutdown");
    rd_kafka_destroy(producer_);
    producer_ = nullptr;
  }
  if (restorer_) {
    if (auto e = rd_kafka_consumer_close(restorer_)) log()->warn("closing restore consumer: {}", rd_kafka_err2str(e));
    rd_kafka_destroy(restorer_);
    restorer_ = nullptr;
  }
}

}  // namespace kstate::ingest
