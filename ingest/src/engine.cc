// The owner's ingest engine: one consumer in the group, the batch loop on the ingest
// thread, the writer (apply_stage) on its own, the rebalance callback, back-pressure
// and the position commits. It is over 700 lines because all of these act on one set
// of fields (the pending batch, owned positions, paused partitions, the fatal state)
// under one rule: which thread may touch which, written next to each field below.
// Spreading the functions over several files would keep that state in one struct
// but put the rule out of sight of most of the code that must follow it. The parts
// with no share in that state live elsewhere: the loop (batch_loop), the writer's
// queue (apply_stage), client set-up (kafka_common), aggregates (agg_pipeline).
#include "ingest/engine.h"

#include "kafka_common.h"

#include <librdkafka/rdkafka.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "agg_pipeline.h"
#include "apply_stage.h"
#include "batch_loop.h"
#include "core/guard.h"
#include "core/value_codec.h"
#include "core/window.h"
#include "dead_letters.h"
#include "ingest/batch_builder.h"
#include "metrics.h"
#include "core/thread_name.h"

namespace kstate::ingest {

struct engine::impl {
  ingest_config cfg;
  std::vector<view_def> views;
  storage::db& db;
  ownership_registry& ownership;
  change_notifier* notifier = nullptr;
  prometheus::Registry* metrics = nullptr;
  ingest_stats stats;
  // Names of the windowed views, whose stored keys carry a window (observed_changes).
  std::set<std::string, std::less<>> windowed_views;

  rd_kafka_t* consumer = nullptr;
  std::unique_ptr<dead_letter_sender> dead_letters;  // null without dead-letter topics
  std::unique_ptr<batch_builder> builder;
  std::unique_ptr<agg_pipeline> agg;  // null without aggregate views
  // Writes the batches the ingest thread builds, on its own thread (apply_stage.h).
  std::unique_ptr<apply_stage> writer;
  // Partitions reached at their end since the last batch was handed over: current once
  // the batch that holds their last records is written.
  std::vector<std::tuple<std::string, int32_t, int64_t>> ends;
  // The partitions paused because the writer's queue was full (ingest thread).
  tpl_ptr paused{nullptr};
  // Input partitions of aggregates held (paused) until their stores caught up from their
  // changelogs, with the offset each resumes at (ingest thread).
  std::map<std::pair<std::string, int32_t>, int64_t> restore_held;
  // The last batch handed to the writer (ingest thread), and the last it wrote.
  uint64_t last_sequence = 0;
  std::atomic<uint64_t> written_sequence{0};
  std::chrono::steady_clock::time_point last_wake{};  // wake_fetcher_if_behind()
  uint64_t turns = 0;                                 // of the batch loop
  std::thread thread;
  std::atomic<bool> running{false};
  std::atomic<bool> stopped{false};
  std::atomic<bool> aborting{false};
  // Set with `fatal`: nothing more is written once the engine failed.
  std::atomic<bool> failed{false};
  // The fatal error is the group fencing this static member (FENCED_INSTANCE_ID).
  std::atomic<bool> fenced{false};
  // A stop interrupted the delivery of the pending batch's dead letters: that batch, and
  // anything after it, is never written (the next start reads its records again).
  bool abandoned = false;
  mutable std::mutex fatal_mu;
  std::string fatal;
  std::set<std::string> topics;
  std::chrono::steady_clock::time_point last_commit{};
  // Next offset applied per owned partition: what is committed to the group. Written by
  // the writer's thread after each write and by the rebalance callback (once the writer
  // drained); read by the ingest thread.
  std::mutex applied_mu;
  std::map<std::pair<std::string, int32_t>, int64_t> applied;  // guarded by applied_mu
  // The first authentication failure librdkafka reported (wrong SASL password, a
  // certificate the broker refused): start() gives up on it instead of retrying until
  // startup_timeout, since retrying cannot fix credentials.
  std::mutex auth_mu;
  std::string auth_error;  // guarded by auth_mu

  // Metrics (owned by the registry; null when no registry was given).
  prometheus::Family<prometheus::Counter>* m_consumed = nullptr;
  prometheus::Family<prometheus::Counter>* m_consumed_bytes = nullptr;
  prometheus::Family<prometheus::Counter>* m_invalid = nullptr;
  prometheus::Family<prometheus::Counter>* m_applied = nullptr;
  prometheus::Histogram* m_batch_records = nullptr;
  prometheus::Histogram* m_apply_seconds = nullptr;
  std::chrono::steady_clock::time_point last_progress{};
  prometheus::Family<prometheus::Counter>* m_rebalances = nullptr;
  prometheus::Counter* m_paused = nullptr;
  prometheus::Gauge* m_queued_bytes = nullptr;
  prometheus::Counter* m_write_failures = nullptr;
  prometheus::Gauge* m_write_stalled = nullptr;

  impl(ingest_config c, std::vector<view_def> v, storage::db& d, ownership_registry& o)
      : cfg(std::move(c)), views(std::move(v)), db(d), ownership(o) {}

  ~impl() {
    if (writer) writer->stop();
    agg.reset();
    if (consumer) rd_kafka_destroy(consumer);
  }

  void set_fatal(std::string msg) {
    log()->critical("{}", msg);
    std::lock_guard lock(fatal_mu);
    if (fatal.empty()) fatal = std::move(msg);  // the first cause, not its consequences
    failed = true;
    running = false;
  }

  // The ingest thread's body. Failures are status values handled where they occur; an
  // exception that still escapes (a bug, std::bad_alloc, a hook that throws) stops the
  // engine with its cause rather than std::terminate.
  void run_guarded() {
    if (auto why = guarded([this] { run(); })) set_fatal("ingest thread stopped by an exception: " + *why);
  }

  // The error callback of the engine's clients, which hands their errors to on_error;
  // the client's opaque must be this impl.
  static void error_cb(rd_kafka_t*, int err, const char* reason, void* opaque) {
    static_cast<impl*>(opaque)->on_error(static_cast<rd_kafka_resp_err_t>(err), reason);
  }

  void on_error(rd_kafka_resp_err_t err, const char* reason) {
    if (err == RD_KAFKA_RESP_ERR__AUTHENTICATION || err == RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED ||
        err == RD_KAFKA_RESP_ERR__SSL) {
      std::lock_guard lock(auth_mu);
      if (auth_error.empty()) auth_error = reason ? reason : rd_kafka_err2str(err);
      log()->error("Kafka authentication failed: {}", reason ? reason : rd_kafka_err2str(err));
      return;
    }
    log()->debug("librdkafka error: {}: {}", rd_kafka_err2str(err), reason ? reason : "");
  }

  // Serves the handle's queued events (error callbacks) without consuming: before
  // subscribe the consumer queue holds only errors and logs.
  std::string poll_auth_error(rd_kafka_t* rk) {
    if (rd_kafka_type(rk) == RD_KAFKA_CONSUMER) {
      while (rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, 0)) {
        if (m->err) on_error(m->err, rd_kafka_message_errstr(m));
        rd_kafka_message_destroy(m);
      }
    } else {
      rd_kafka_poll(rk, 0);
    }
    std::lock_guard lock(auth_mu);
    return auth_error;
  }

  status create_consumer() {
    auto rk = create_client(cfg, engine_consumer_spec(cfg), [this](rd_kafka_conf_t* conf) {
      rd_kafka_conf_set_error_cb(conf, error_cb);
      rd_kafka_conf_set_opaque(conf, this);
      rd_kafka_conf_set_rebalance_cb(
          conf, [](rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts, void* opaque) {
            // Nothing may unwind through librdkafka's C frames.
            auto* self = static_cast<impl*>(opaque);
            if (auto why = guarded([&] { self->on_rebalance(rk, err, parts); }))
              self->set_fatal("rebalance callback stopped by an exception: " + *why);
          });
    });
    if (!rk.ok()) return rk.error();
    consumer = rk.value().release();
    return status::ok_status();
  }

  status create_dead_letter_sender() {
    dead_letters = std::make_unique<dead_letter_sender>(
        cfg, [this](rd_kafka_resp_err_t err, const char* reason) { on_error(err, reason); },
        [this] { return running.load(); }, stats, metrics);
    return dead_letters->start();
  }

  // Partition counts of `names`; error naming the first topic that does not exist.
  status load_partition_counts(const std::set<std::string>& names, rd_kafka_t* rk) {
    const rd_kafka_metadata_t* md = nullptr;
    auto deadline = std::chrono::steady_clock::now() + cfg.startup_timeout;
    rd_kafka_resp_err_t err;
    while ((err = rd_kafka_metadata(rk, 1, nullptr, &md, 1000)) != RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (aborting) return status::unavailable("start aborted");
      if (auto auth = poll_auth_error(rk); !auth.empty())
        return status::invalid_argument(
            "Kafka at " + cfg.bootstrap_servers +
            " refused the credentials (check kafka: " + "sasl.username / sasl.password / ssl.*): " + auth);
      if (std::chrono::steady_clock::now() > deadline)
        return status::unavailable(std::string("cannot reach Kafka at ") + cfg.bootstrap_servers + ": " +
                                   rd_kafka_err2str(err));
      log()->warn("metadata request failed ({}), retrying", rd_kafka_err2str(err));
    }
    std::map<std::string, int32_t> counts;
    for (int i = 0; i < md->topic_cnt; ++i)
      if (md->topics[i].err == RD_KAFKA_RESP_ERR_NO_ERROR) counts[md->topics[i].topic] = md->topics[i].partition_cnt;
    rd_kafka_metadata_destroy(md);
    for (const auto& t : names) {
      auto it = counts.find(t);
      if (it == counts.end()) return status::not_found("topic '" + t + "' does not exist");
      ownership.set_partition_count(t, it->second);
    }
    return status::ok_status();
  }

  void on_rebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts) {
    ++stats.rebalances;
    if (m_rebalances) m_rebalances->Add({{"consumergroup", cfg.application_id}}).Increment();
    bool cooperative = std::string_view(rd_kafka_rebalance_protocol(rk)) == "COOPERATIVE";
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
      // Offsets sent with a transaction carry the group generation: commit what is
      // pending under the generation it was consumed in. Stored positions are read
      // below: everything consumed so far is written first.
      if (!flush_and_drain()) return;
      resume_paused();
      if (cfg.before_assign) {
        std::vector<std::pair<std::string, int32_t>> taken;
        taken.reserve(parts->cnt);
        for (int i = 0; i < parts->cnt; ++i) taken.emplace_back(parts->elems[i].topic, parts->elems[i].partition);
        cfg.before_assign(taken);
      }
      std::vector<ownership_registry::assignment> added;
      for (int i = 0; i < parts->cnt; ++i) {
        auto& p = parts->elems[i];
        std::string topic = p.topic;
        std::optional<int64_t> resume;
        bool every_view_known = true;
        bool table_views = false;
        for (const auto& v : views) {
          if (v.is_aggregate() || v.topic != topic) continue;
          table_views = true;
          auto id = db.find_view(v.name);
          auto stored = db.stored_position(*id, p.partition);
          if (!stored.ok()) {
            set_fatal("reading stored position of " + v.name + "/" + std::to_string(p.partition) + ": " +
                      stored.error().to_string());
            return;
          }
          if (stored.value()) {
            builder->set_view_position(topic, p.partition, v.name, *stored.value());
          } else {
            every_view_known = false;
          }
        }
        resume = every_view_known ? builder->resume_offset(topic, p.partition) : std::nullopt;
        bool restoring = false;
        if (agg && agg->handles(topic)) {
          // Aggregates resume from the group's committed offset; a topic that also
          // feeds table views resumes at the lower of the two (each skips what it has).
          size_t planned_before = agg->planned_count();
          auto agg_resume = agg->plan_assign(topic, p.partition);
          if (!agg_resume.ok()) {
            set_fatal(agg_resume.error().to_string());
            return;
          }
          restoring = agg->planned_count() > planned_before;
          if (!table_views) resume = agg_resume.value();
          else if (!resume || !agg_resume.value()) resume = std::nullopt;
          else resume = std::min(*resume, *agg_resume.value());
        }
        p.offset = resume ? *resume : RD_KAFKA_OFFSET_BEGINNING;
        // Held until the restore is done, then fetched from here: the lower of the
        // aggregate's and the tables' resume offsets, as when nothing is restored.
        if (restoring) restore_held[{topic, p.partition}] = p.offset;
        int64_t low = 0, high = -1;
        auto werr = rd_kafka_query_watermark_offsets(rk, topic.c_str(), p.partition, &low, &high, 5000);
        // A topic kstate just created (repartition) may have no leader for a moment.
        for (int attempt = 0; werr && attempt < 50; ++attempt) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          werr = rd_kafka_query_watermark_offsets(rk, topic.c_str(), p.partition, &low, &high, 5000);
        }
        if (werr) log()->warn("watermarks of {}-{}: {}", topic, p.partition, rd_kafka_err2str(werr));
        // Records before the end are re-applied (views with a ttl by ingest time give them
        // their timestamps); an unknown end: every record, to be safe.
        builder->set_catch_up(topic, p.partition, !werr && high >= 0 ? high : std::numeric_limits<int64_t>::max());
        int64_t at = resume.value_or(0);
        {
          std::lock_guard lock(applied_mu);
          applied[{topic, p.partition}] = at;
        }
        added.push_back({topic, p.partition, high, !restoring && high >= 0 && (at >= high || high == low), at});
        log()->info("assigned {}-{}: resuming at {}, catching up to {}", topic, p.partition,
                    resume ? std::to_string(at) : std::string("beginning"), high);
      }
      ownership.assign(added);
      rd_kafka_error_t* e = nullptr;
      rd_kafka_resp_err_t aerr = RD_KAFKA_RESP_ERR_NO_ERROR;
      if (cooperative) e = rd_kafka_incremental_assign(rk, parts);
      else aerr = rd_kafka_assign(rk, parts);
      if (e) {
        set_fatal(std::string("incremental assign: ") + rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
      }
      if (aerr) set_fatal(std::string("assign: ") + rd_kafka_err2str(aerr));
      // Stores behind the committed offsets catch up from their changelogs before their
      // input is consumed: the input stays paused, and the restore runs between polls
      // (restore_step), never inside this callback, so however long it takes the group
      // sees this member poll. /readyz shows the progress meanwhile.
      hold_restoring(rk, parts);
    } else {
      // Write what was consumed for these partitions before releasing them, so the
      // next owner (or this instance later) resumes exactly after it. Once the engine
      // failed (or a stop gave the batch up) nothing is written: the partitions are
      // released where their stored positions stand.
      ownership.mark_joined();
      // Every batch of these partitions is written before the revocation completes: the
      // next owner resumes exactly after it, and nothing of them is written later.
      (void)flush_and_drain();
      forget_stored_positions(parts);
      resume_paused();
      std::vector<std::pair<std::string, int32_t>> given_up;
      for (int i = 0; i < parts->cnt; ++i) {
        auto& p = parts->elems[i];
        ownership.revoke(p.topic, p.partition);
        builder->forget_partition(p.topic, p.partition);
        restore_held.erase({p.topic, p.partition});
        if (agg)
          if (auto s = agg->forget(p.topic, p.partition); !s.ok())
            set_fatal("ending the restore of a revoked partition: " + s.to_string());
        {
          std::lock_guard lock(applied_mu);
          applied.erase({p.topic, p.partition});
        }
        given_up.emplace_back(p.topic, p.partition);
        log()->info("revoked {}-{}", p.topic, p.partition);
      }
      // Nothing of these partitions is written by this engine any more.
      if (cfg.after_revoke) cfg.after_revoke(given_up);
      rd_kafka_error_t* e = nullptr;
      rd_kafka_resp_err_t aerr = RD_KAFKA_RESP_ERR_NO_ERROR;
      if (cooperative) e = rd_kafka_incremental_unassign(rk, parts);
      else aerr = rd_kafka_assign(rk, nullptr);
      if (e) {
        set_fatal(std::string("incremental unassign: ") + rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
      }
      if (aerr) set_fatal(std::string("unassign: ") + rd_kafka_err2str(aerr));
    }
    if (cfg.on_rebalance) cfg.on_rebalance();
  }

  // Hands the pending batch to the writer (apply_stage): its dead letters settled and,
  // for aggregates, its transaction committed first, so the written positions never
  // pass either. False when nothing can be written: the engine failed (the loop stops),
  // or a stop gave up the batch while its dead letters were still unsettled.
  bool flush() {
    if (failed || abandoned) return false;
    if (builder->pending_records() == 0 && ends.empty()) return true;
    const auto& rejected = builder->rejections();
    for (const auto& r : rejected)
      log()->warn("invalid record {}-{}@{} in view {}: {}", r.topic, r.partition, r.offset, r.view, r.reason);
    // A batch's position never passes a dead letter that is not settled (see
    // dead_letters.h): delivered whole, as an envelope, or counted as failed.
    if (dead_letters && dead_letters->deliver(rejected) == dead_letter_sender::outcome::interrupted) {
      log()->warn(
          "stopping before the dead letters of the last batch were acknowledged: its {} records are not "
          "written and are read again at the next start",
          builder->pending_records());
      abandoned = true;
      return false;
    }
    const uint64_t sequence = ++last_sequence;
    if (agg) {
      std::string why;
      agg->written(written_sequence.load());
      switch (agg->commit(builder->batch(), why, sequence)) {
        case agg_pipeline::outcome::committed: break;
        case agg_pipeline::outcome::aborted: ++stats.aborted; break;
        case agg_pipeline::outcome::fatal:
          // A producer that failed for good is replaced like a fenced consumer: the
          // engine stops and a new one rejoins on the same stores (fenced()).
          if (agg->producer_failed()) fenced = true;
          set_fatal("aggregate transaction failed: " + why);
          return false;
      }
    }
    built_batch b = builder->take(writer->recycled());
    if (agg)
      for (const auto& [tp, next] : agg->take_consumed()) b.touched[tp] = std::max(b.touched[tp], next);
    b.ends = std::move(ends);
    ends.clear();
    b.sequence = sequence;
    if (!writer->submit(std::move(b))) return false;  // the writer failed, and said why
    if (m_queued_bytes) m_queued_bytes->Set(static_cast<double>(writer->pending_bytes()));
    return true;
  }

  // flush(), then waits until the writer wrote everything handed to it.
  bool flush_and_drain() {
    if (!flush() || !writer->drain()) return false;
    if (agg) agg->written(written_sequence.load());
    return true;
  }

  // The writer's thread: one batch, one atomic RocksDB write, then what it changed is
  // reported (counters, positions, readiness, waiting readers). False stops the writer.
  bool write_built(built_batch& b) {
    if (failed) return false;
    auto started = std::chrono::steady_clock::now();
    if (!b.batch.empty()) {
      std::vector<applied_change> observed;
      if (cfg.changes && cfg.changes->any()) observed = observed_changes(b.batch);
      auto s = db.write(b.batch);
      if (!s.ok() && s.code() == status_code::io_error) s = wait_out_write_failure(b, s);
      if (!s.ok()) {
        if (s.code() != status_code::unavailable) set_fatal("RocksDB write failed: " + s.to_string());
        return false;
      }
      ++stats.batches;
      if (notifier) notifier->notify();
      if (!observed.empty()) cfg.changes->applied(std::move(observed));
    }
    for (const auto& [tp, c] : b.partition_counts) {
      stats.applied += c.applied;
      stats.invalid += c.invalid;
      if (m_consumed) {
        prometheus::Labels l{{"topic", tp.first}, {"partition", std::to_string(tp.second)}};
        m_consumed->Add(l).Increment(static_cast<double>(c.records));
        m_consumed_bytes->Add(l).Increment(static_cast<double>(c.bytes));
      }
    }
    if (m_applied) {
      for (const auto& [key, c] : b.view_counts) {
        prometheus::Labels l{
            {"store", std::get<0>(key)}, {"topic", std::get<1>(key)}, {"partition", std::to_string(std::get<2>(key))}};
        if (c.applied) m_applied->Add(l).Increment(static_cast<double>(c.applied));
        if (c.invalid) m_invalid->Add(l).Increment(static_cast<double>(c.invalid));
      }
      if (b.records) m_batch_records->Observe(static_cast<double>(b.records));
      m_apply_seconds->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
    for (const auto& [tp, next] : b.touched) {
      {
        std::lock_guard lock(applied_mu);
        if (auto it = applied.find(tp); it != applied.end()) it->second = next;
      }
      // Positions move with every batch; watermarks refresh once a second.
      ownership.update_progress(tp.first, tp.second, next, -1);
      check_ready(tp.first, tp.second, next);
    }
    for (const auto& [topic, partition, end] : b.ends) check_ready(topic, partition, end);
    written_sequence = b.sequence;
    // Still counts this batch: the stage subtracts it once this returns.
    if (m_queued_bytes) m_queued_bytes->Set(static_cast<double>(writer->pending_bytes() - b.bytes()));
    return true;
  }

  // The changes of observed views in a batch about to be written, each key's old value
  // read now, before the write (the writer thread is the only one writing the owner's
  // partitions, so nothing comes in between). Writer thread.
  std::vector<applied_change> observed_changes(const storage::write_batch& batch) {
    auto entries = batch.entries();
    std::map<std::pair<storage::view_id, int32_t>, int64_t> next;
    for (const auto& e : entries)
      if (e.position) next[{e.view, e.partition}] = *e.position;
    std::vector<applied_change> out;
    for (auto& e : entries) {
      if (e.position) continue;
      const auto& name = db.view_name(e.view);
      if (!cfg.changes->observes(name)) continue;
      applied_change c;
      c.view = name;
      c.partition = e.partition;
      if (auto it = next.find({e.view, e.partition}); it != next.end()) c.next_offset = it->second;
      auto old = db.get(e.view, e.partition, e.key);
      if (!old.ok()) {
        // Said, not hidden: the change still arrives, without its old value.
        log()->warn("change listener: reading the old value of a key of '{}' failed: {}", name,
                    old.error().to_string());
      } else if (old->value) {
        if (auto f = unframe_value(*old->value)) c.old_value = std::string(f->value);
      }
      if (e.value) {
        if (auto f = unframe_value(*e.value)) {
          c.new_value = std::string(f->value);
          c.offset = f->offset;
        }
      }
      if (windowed_views.count(name)) {
        if (auto wk = decode_windowed_key(e.key)) {
          c.key = std::move(wk->key);
          c.window_start = wk->start;
        } else {
          c.key = std::move(e.key);
        }
      } else {
        c.key = std::move(e.key);
      }
      out.push_back(std::move(c));
    }
    return out;
  }

  // A write the state directory refused (disk full, read-only, I/O error): nothing of
  // the batch was applied, and RocksDB takes no write until it recovers. Ingest stops
  // applying (the writer's queue fills, then fetching pauses), reads go on from what is
  // stored, the instance is not ready, and the same batch is tried again every second
  // until it is written. A stop ends the wait without writing it (unavailable): its
  // records are read again at the next start. Other failures return as they are.
  status wait_out_write_failure(built_batch& b, status s) {
    const auto since = std::chrono::steady_clock::now();
    log()->error(
        "RocksDB write failed: {}; applying stops until the state directory takes writes again (reads go on, "
        "/readyz answers 503, retrying every second)",
        s.to_string());
    ownership.set_write_failure(s.to_string());
    if (m_write_failures) m_write_failures->Increment();
    if (m_write_stalled) m_write_stalled->Set(1);
    while (s.code() == status_code::io_error) {
      for (int i = 0; i < 10 && running; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!running) {
        s = status::unavailable("stopped while the state directory refused writes");
        break;
      }
      // Resume() fails as long as RocksDB cannot flush; the write then says why.
      (void)db.resume();
      s = db.write(b.batch);
    }
    ownership.set_write_failure({});
    if (m_write_stalled) m_write_stalled->Set(0);
    if (s.ok())
      log()->info("the state directory takes writes again after {:.1f} s: applying resumes",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count());
    return s;
  }

  // The periodic work of the ingest thread: commits for monitoring, lag, producer
  // callbacks.
  void periodic() {
    auto now = std::chrono::steady_clock::now();
    if (now - last_commit >= cfg.commit_interval) store_positions();
    if (now - last_progress >= std::chrono::seconds(1)) publish_progress();
    if (dead_letters) dead_letters->poll();
    if (agg) agg->poll();
  }

  // Back-pressure from the writer. While its queue is full the ingest thread waits for
  // room instead of polling: the records wait in librdkafka's prefetch queue, which
  // stops fetching at queued.max.messages.kbytes, and nothing is fetched twice. Only a
  // writer stuck for longer than stuck_after (a full disk) pauses the partitions, so
  // that the loop can go back to polling (rebalances, max.poll.interval.ms) with memory
  // still bounded; they are resumed once the writer drained.
  void wait_for_writer() {
    constexpr auto stuck_after = std::chrono::seconds(30);
    const auto since = std::chrono::steady_clock::now();
    while (running && !paused && writer->full()) {
      writer->wait_for_room(std::chrono::milliseconds(100));
      periodic();
      if (std::chrono::steady_clock::now() - since >= stuck_after) pause_all();
    }
    if (paused && writer->drained()) resume_paused();
  }

  void pause_all() {
    rd_kafka_topic_partition_list_t* assigned = nullptr;
    if (rd_kafka_assignment(consumer, &assigned) != RD_KAFKA_RESP_ERR_NO_ERROR || !assigned) return;
    tpl_ptr list(assigned);
    if (list->cnt == 0) return;
    log()->warn("the writer has not taken a batch for 30 s: fetching paused until it catches up");
    if (auto err = rd_kafka_pause_partitions(consumer, list.get())) {
      log()->warn("pausing fetches: {}", rd_kafka_err2str(err));
      return;
    }
    paused = std::move(list);
    if (m_paused) m_paused->Increment();
  }

  // librdkafka 2.0.2 stops fetching a partition whose prefetch queue reached its
  // threshold (queued.min.messages, queued.max.messages.kbytes), and decides again only
  // when its broker thread wakes up: for a request, a response, or after up to a second.
  // Ingest that waited for the writer drains that queue faster than a second, and would
  // then stall for the rest of it. So when a poll finds nothing while a partition is
  // known to be behind its end (librdkafka's cached high watermark, no request), a
  // ListOffsets request to that partition's leader wakes the broker thread, which
  // fetches again at once. At most one every 20 ms; caught up, no partition is behind
  // and nothing is sent.
  void wake_fetcher_if_behind() {
    const auto now = std::chrono::steady_clock::now();
    if (paused || now - last_wake < std::chrono::milliseconds(20)) return;
    last_wake = now;
    rd_kafka_topic_partition_list_t* raw = nullptr;
    if (rd_kafka_assignment(consumer, &raw) != RD_KAFKA_RESP_ERR_NO_ERROR || !raw) return;
    tpl_ptr assigned(raw);
    if (assigned->cnt == 0 || rd_kafka_position(consumer, assigned.get()) != RD_KAFKA_RESP_ERR_NO_ERROR) return;
    for (int i = 0; i < assigned->cnt; ++i) {
      const auto& p = assigned->elems[i];
      int64_t low = -1, high = -1;
      if (p.offset < 0 ||
          rd_kafka_get_watermark_offsets(consumer, p.topic, p.partition, &low, &high) != RD_KAFKA_RESP_ERR_NO_ERROR ||
          p.offset >= high)
        continue;
      // The answer is not needed: sending the request is what wakes the fetcher.
      (void)rd_kafka_query_watermark_offsets(consumer, p.topic, p.partition, &low, &high, 1000);
      ++stats.fetcher_wakeups;
      return;
    }
  }

  // Pauses the newly assigned input partitions whose stores restore first.
  void hold_restoring(rd_kafka_t* rk, rd_kafka_topic_partition_list_t* parts) {
    tpl_ptr hold(rd_kafka_topic_partition_list_new(parts->cnt));
    for (int i = 0; i < parts->cnt; ++i)
      if (restore_held.count({parts->elems[i].topic, parts->elems[i].partition}))
        rd_kafka_topic_partition_list_add(hold.get(), parts->elems[i].topic, parts->elems[i].partition);
    if (hold->cnt == 0) return;
    if (auto err = rd_kafka_pause_partitions(rk, hold.get()))
      set_fatal(std::string("pausing partitions that restore first: ") + rd_kafka_err2str(err));
  }

  // Runs the changelog restores for a while, between polls; an input partition whose
  // store caught up is resumed at its committed offset.
  void restore_step() {
    if (!agg || restore_held.empty() || failed) return;
    auto done = agg->restore_some(std::chrono::milliseconds(200), running);
    stats.restored = agg->restored_records();
    if (!done.ok()) return set_fatal("restoring from changelog: " + done.error().to_string());
    if (done->empty()) return;
    tpl_ptr list(rd_kafka_topic_partition_list_new(static_cast<int>(done->size())));
    for (const auto& [topic, partition] : *done) {
      auto it = restore_held.find({topic, partition});
      if (it == restore_held.end()) continue;
      rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), partition)->offset = it->second;
      restore_held.erase(it);
    }
    if (list->cnt == 0) return;
    if (auto err = rd_kafka_resume_partitions(consumer, list.get()))
      return set_fatal(std::string("resuming restored partitions: ") + rd_kafka_err2str(err));
    // A resume alone does not wake librdkafka 2.0.2's fetcher; a seek does.
    if (rd_kafka_error_t* e = rd_kafka_seek_partitions(consumer, list.get(), 0)) {
      log()->warn("seeking restored partitions: {}", rd_kafka_error_string(e));
      rd_kafka_error_destroy(e);
    }
  }

  // Resumes the paused partitions where the consumer stands. The seek matters: in
  // librdkafka 2.0.2 a resume alone does not wake the fetcher, which then sleeps up to
  // a second; a seek does.
  void resume_paused() {
    if (!paused) return;
    // Partitions that wait for their store's restore stay paused.
    if (!restore_held.empty()) {
      tpl_ptr kept(rd_kafka_topic_partition_list_new(paused->cnt));
      for (int i = 0; i < paused->cnt; ++i)
        if (!restore_held.count({paused->elems[i].topic, paused->elems[i].partition}))
          rd_kafka_topic_partition_list_add(kept.get(), paused->elems[i].topic, paused->elems[i].partition)->offset =
              paused->elems[i].offset;
      paused = std::move(kept);
    }
    if (auto err = rd_kafka_resume_partitions(consumer, paused.get()))
      log()->warn("resuming fetches: {}", rd_kafka_err2str(err));
    if (rd_kafka_position(consumer, paused.get()) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      // Partitions revoked meanwhile, or never consumed from, have no position: skipped.
      tpl_ptr at(rd_kafka_topic_partition_list_new(paused->cnt));
      for (int i = 0; i < paused->cnt; ++i)
        if (paused->elems[i].offset >= 0)
          rd_kafka_topic_partition_list_add(at.get(), paused->elems[i].topic, paused->elems[i].partition)->offset =
              paused->elems[i].offset;
      if (at->cnt > 0)
        if (rd_kafka_error_t* e = rd_kafka_seek_partitions(consumer, at.get(), 0)) rd_kafka_error_destroy(e);
    }
    log()->info("the writer caught up: fetching again");
    paused.reset();
  }

  void check_ready(const std::string& topic, int32_t partition, int64_t next) {
    auto t = ownership.topic(topic);
    if (!t) return;
    auto it = t->partitions.find(partition);
    if (it == t->partitions.end() || it->second.ready || !it->second.assigned) return;
    if (it->second.catch_up_target >= 0 && next >= it->second.catch_up_target) {
      ownership.mark_ready(topic, partition);
      log()->info("{}-{} caught up at {}", topic, partition, next);
    }
  }

  // Applied position and high watermark of every owned partition, for lag reporting.
  // The watermarks are librdkafka's cached values from fetch responses: no request.
  void publish_progress() {
    std::lock_guard lock(applied_mu);
    for (const auto& [tp, next] : applied) {
      int64_t low = -1, high = -1;
      if (rd_kafka_get_watermark_offsets(consumer, tp.first.c_str(), tp.second, &low, &high) !=
          RD_KAFKA_RESP_ERR_NO_ERROR)
        high = -1;
      ownership.update_progress(tp.first, tp.second, next, high);
    }
    last_progress = std::chrono::steady_clock::now();
  }

  // The applied positions of the partitions whose group offsets the engine keeps:
  // aggregate inputs are left out, their committed offset is the pipeline's (it moves
  // with the outputs). Null when there is none.
  tpl_ptr applied_positions() {
    std::lock_guard lock(applied_mu);
    if (applied.empty()) return tpl_ptr(nullptr);
    tpl_ptr list(rd_kafka_topic_partition_list_new(static_cast<int>(applied.size())));
    for (const auto& [tp, next] : applied)
      if (next > 0 && !(agg && agg->handles(tp.first)))
        rd_kafka_topic_partition_list_add(list.get(), tp.first.c_str(), tp.second)->offset = next;
    if (list->cnt == 0) return tpl_ptr(nullptr);
    return list;
  }

  // Hands the applied positions to librdkafka, whose auto-commit timer commits them
  // while the group is steady (kafka_common.cc says why never during a rebalance).
  void store_positions() {
    last_commit = std::chrono::steady_clock::now();
    auto list = applied_positions();
    if (!list) return;
    // A partition revoked meanwhile is refused: it is not this member's to commit.
    if (auto err = rd_kafka_offsets_store(consumer, list.get()))
      log()->debug("storing positions for the group's commits (informational): {}", rd_kafka_err2str(err));
  }

  // Commits the applied positions now and waits (the engine is stopping).
  void commit_positions() {
    auto list = applied_positions();
    if (!list) return;
    auto err = rd_kafka_commit(consumer, list.get(), 0);
    if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
      log()->debug("committing positions to the group (informational): {}", rd_kafka_err2str(err));
  }

  // Partitions being revoked commit nothing: librdkafka would commit their stored
  // offsets while the rebalance is under way, with a generation that another member's
  // join can make stale (a lost assignment in librdkafka 2.0.2, kafka_common.cc). The
  // next owner commits its own positions once the group is steady.
  void forget_stored_positions(const rd_kafka_topic_partition_list_t* parts) {
    tpl_ptr list(rd_kafka_topic_partition_list_new(parts->cnt));
    for (int i = 0; i < parts->cnt; ++i)
      rd_kafka_topic_partition_list_add(list.get(), parts->elems[i].topic, parts->elems[i].partition)->offset =
          RD_KAFKA_OFFSET_INVALID;
    (void)rd_kafka_offsets_store(consumer, list.get());
  }

  // What a hook returns when flush() wrote nothing: the engine failed (already
  // reported) or a stop gave the batch up. Either way the loop ends.
  static status not_written() { return status::unavailable("the pending batch was not written"); }

  void run() {
    batch_loop_options options{"consumer", static_cast<size_t>(cfg.max_batch_records), cfg.max_batch_delay, 100};
    batch_loop_hooks hooks;
    // The periodic work reads the clock: every 1,024 records while records stream in,
    // and at every poll that finds nothing.
    hooks.each_turn = [this] {
      if (writer->failed()) return not_written();
      wait_for_writer();
      restore_step();
      if ((++turns & 1023) == 0) periodic();
      return status::ok_status();
    };
    hooks.after_add = [this](const record& r) {
      ++stats.consumed;
      if (agg && agg->handles(r.topic)) {
        if (auto s = agg->add(r); !s.ok()) {
          set_fatal("applying aggregate: " + s.to_string());
          return s;
        }
      }
      return status::ok_status();
    };
    hooks.at_end = [this](const std::string& topic, int32_t partition, int64_t end) {
      // Everything up to the end was consumed; once written, the partition is current.
      ends.emplace_back(topic, partition, end);
      return flush() ? status::ok_status() : not_written();
    };
    hooks.write = [this] { return flush() ? status::ok_status() : not_written(); };
    hooks.busy = [this] { return !restore_held.empty(); };
    hooks.idle = [this] {
      periodic();
      wake_fetcher_if_behind();
    };
    auto s = run_batch_loop(consumer, *builder, running, options, hooks);
    // A restore cut short by the stop: what it applied is written, and the next start
    // goes on from there.
    if (agg)
      if (auto r = agg->stop_restore(); !r.ok()) set_fatal("ending a restore: " + r.to_string());
    // Failures of the hooks were reported where they happened; what is left is the
    // consumer's own fatal error.
    if (!s.ok() && !failed && !abandoned) {
      char why[512];
      if (rd_kafka_fatal_error(consumer, why, sizeof why) == RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID) fenced = true;
      set_fatal(s.message());
    }
  }
};

engine::engine(ingest_config cfg, std::vector<view_def> views, storage::db& db, ownership_registry& ownership,
               prometheus::Registry* metrics, change_notifier* notifier)
    : impl_(std::make_unique<impl>(std::move(cfg), std::move(views), db, ownership)) {
  impl_->notifier = notifier;
  impl_->metrics = metrics;
  for (const auto& v : impl_->views)
    if (v.windowed()) impl_->windowed_views.insert(v.name);
  if (metrics) {
    impl_->m_consumed =
        &counter_family(*metrics, "kstate_ingest_records_consumed_total", "Records consumed from source topics");
    impl_->m_consumed_bytes = &counter_family(*metrics, "kstate_ingest_bytes_consumed_total",
                                              "Key and value bytes consumed from source topics");
    impl_->m_invalid =
        &counter_family(*metrics, "kstate_ingest_records_invalid_total", "Records rejected by a view (malformed)");
    impl_->m_applied = &counter_family(*metrics, "kstate_ingest_records_applied_total", "Records applied to a store");
    impl_->m_batch_records =
        &unlabelled_histogram(*metrics, "kstate_ingest_batch_records", "Records per applied batch (one RocksDB write)",
                              prometheus::Histogram::BucketBoundaries{1, 10, 100, 1000, 5000, 10000, 50000});
    impl_->m_apply_seconds = &unlabelled_histogram(
        *metrics, "kstate_ingest_apply_duration_seconds",
        "Time to write one batch (its RocksDB write and what it reports)",
        prometheus::Histogram::BucketBoundaries{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1});
    impl_->m_rebalances =
        &counter_family(*metrics, "kstate_ingest_rebalances_total", "Assignment changes of this instance");
    impl_->m_paused = &counter_family(*metrics, "kstate_ingest_fetch_pauses_total",
                                      "Times fetching was paused because the writer took no batch for 30 s")
                           .Add({});
    impl_->m_queued_bytes =
        &unlabelled_gauge(*metrics, "kstate_ingest_write_queue_bytes",
                          "Bytes of batches read from Kafka that wait for the writer thread or are being written");
    impl_->m_write_failures =
        &counter_family(*metrics, "kstate_ingest_write_failures_total",
                        "Times the state directory refused a write (disk full, read-only): applying stopped until it "
                        "took the write")
             .Add({});
    impl_->m_write_stalled = &unlabelled_gauge(*metrics, "kstate_ingest_write_stalled",
                                               "1 while the state directory refuses writes and applying waits, else 0");
  }
}

engine::~engine() { stop(); }

status engine::start() {
  auto& i = *impl_;
  auto builder = batch_builder::create(i.db, i.views, i.cfg.max_json_depth);
  if (!builder.ok()) return builder.error();
  i.builder = std::move(builder.value());
  i.writer = std::make_unique<apply_stage>(
      [&i](built_batch& b) {
        bool written = false;
        if (auto why = guarded([&] { written = i.write_built(b); })) {
          i.set_fatal("ingest writer stopped by an exception: " + *why);
          return false;
        }
        return written;
      },
      i.cfg.max_queued_bytes);
  std::set<std::string> dlq_topics;
  std::vector<const view_def*> aggregates;
  for (const auto& v : i.views) {
    i.topics.insert(v.input_topic());
    if (v.is_join()) i.topics.insert(v.join->right_topic);
    if (v.is_aggregate()) aggregates.push_back(&v);
    if (!v.dead_letter_topic.empty()) dlq_topics.insert(v.dead_letter_topic);
  }
  if (auto s = i.create_consumer(); !s.ok()) return s;
  if (!dlq_topics.empty())
    if (auto s = i.create_dead_letter_sender(); !s.ok()) return s;
  if (auto s = i.load_partition_counts(i.topics, i.consumer); !s.ok()) return s;
  if (!dlq_topics.empty()) {
    if (auto s = i.load_partition_counts(dlq_topics, i.dead_letters->handle()); !s.ok())
      return status::not_found("dead-letter " + s.message());
  }
  if (!aggregates.empty()) {
    auto agg = agg_pipeline::create(i.cfg, aggregates, i.db, i.ownership, *i.builder, i.metrics);
    if (!agg.ok()) return agg.error();
    i.agg = std::move(agg.value());
    if (auto s = i.agg->start(i.consumer, i.topics); !s.ok()) return s;
  }
  tpl_ptr subs(rd_kafka_topic_partition_list_new(static_cast<int>(i.topics.size())));
  for (const auto& t : i.topics) rd_kafka_topic_partition_list_add(subs.get(), t.c_str(), RD_KAFKA_PARTITION_UA);
  if (auto err = rd_kafka_subscribe(i.consumer, subs.get()))
    return status::invalid_argument(std::string("subscribe: ") + rd_kafka_err2str(err));
  i.running = true;
  i.last_commit = std::chrono::steady_clock::now();
  i.thread = std::thread([&i] {
    name_this_thread("ks-ingest");
    i.run_guarded();
  });
  log()->info("consuming {} topic(s) as group '{}'", i.topics.size(), i.cfg.application_id);
  return status::ok_status();
}

void engine::stop() {
  auto& i = *impl_;
  if (i.stopped.exchange(true)) return;
  i.running = false;
  if (i.thread.joinable()) i.thread.join();
  if (i.consumer) {
    if (!i.failed) {
      // On this (the caller's) thread now: guarded like the ingest thread.
      auto why = guarded([&i] {
        // A failure is logged inside; the written positions are committed.
        if (i.builder) (void)i.flush_and_drain();
        i.commit_positions();
      });
      if (why) i.set_fatal("stopping ingest: " + *why);
    }
    // Leaves the group; the revoke callback runs here and writes nothing more.
    auto err = rd_kafka_consumer_close(i.consumer);
    if (err) log()->warn("closing consumer: {}", rd_kafka_err2str(err));
  }
  if (i.writer) i.writer->stop();
  if (i.agg) i.agg->close();
  i.ownership.revoke_all();
  log()->info("stopped after consuming {} records", i.stats.consumed.load());
}

void engine::abort_start() { impl_->aborting = true; }

const ingest_stats& engine::stats() const { return impl_->stats; }

bool engine::fenced() const { return impl_->fenced; }

std::string engine::fatal_error() const {
  std::lock_guard lock(impl_->fatal_mu);
  return impl_->fatal;
}

}  // namespace kstate::ingest
