#include "ingest/standby.h"

#include "kafka_common.h"

#include <librdkafka/rdkafka.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "agg_pipeline.h"
#include "batch_loop.h"
#include "changelog_apply.h"
#include "core/guard.h"
#include "ingest/batch_builder.h"
#include "metrics.h"
#include "core/thread_name.h"

namespace kstate::ingest {
namespace {

using tp = std::pair<std::string, int32_t>;

// An aggregate view whose partitions are copied by following its changelog. A
// foreign-key join has two: its left rows (the view, on its repartition topic) and its
// right side (fk_right_view(), on its subscription topic), each a store topic of its own
// whose partitions the group assigns, restores and hands over separately.
struct agg_copy {
  const view_def* def;
  storage::view_id id;
  std::optional<storage::view_id> sides;  // join views
  std::unique_ptr<joiner> join;           // join views; its address is in target()
  bool fk_right = false;                  // a foreign-key join's right side
  changelog_target target() const { return {def, id, sides, join.get(), fk_right}; }
};

// How far the copy of one partition of an aggregate view follows its changelog.
struct changelog_copy {
  int64_t next = 0;          // next changelog offset to apply
  int64_t stream_time = -1;  // windowed views: largest event time applied
  // The store-topic position the copy reflects for certain (the view's position, what
  // allow_stale answers report): the largest kstate.offset + 1 applied, taken only when
  // the copy reached the changelog's end, so every committed transaction is applied
  // whole. -1: none yet.
  int64_t input = -1;
  int64_t input_seen = -1;  // the largest kstate.offset + 1 applied so far
  bool changed = false;     // something to write since the last write
};

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
  prometheus::Counter* m_failures = nullptr;

  rd_kafka_t* consumer = nullptr;
  std::unique_ptr<batch_builder> builder;  // table views
  // Aggregate views, copied from their changelogs: by changelog topic, and the copies
  // being followed, by (view index, partition). Their batch is written with the
  // builder's, under the same fence.
  std::vector<agg_copy> aggs;
  // The views of foreign-key joins' right sides (a deque: aggs point into it).
  std::deque<view_def> fk_rights;
  std::map<std::string, size_t, std::less<>> by_changelog;
  std::map<std::pair<size_t, int32_t>, changelog_copy> followed;
  std::optional<storage::write_batch> changelog_batch;
  size_t changelog_held = 0;  // records (and end-of-changelog position moves) unwritten
  std::thread thread;
  std::atomic<bool> running{false};
  standby_engine::write_hook before_write_for_testing;

  // Guards the sets below, and is held around every RocksDB write of the copies: a
  // write and a claim never interleave.
  mutable std::mutex mu;
  std::condition_variable released_cv;
  std::set<tp> current;  // assigned to the standby consumer
  // Partitions the owner took over, from release() until give_back(). No batch that
  // touches one is written, except, for a partition still in release_requests, the
  // hand-over's own write of what the copy holds of it.
  std::set<tp> claimed;
  // Claimed partitions whose hand-over release() is waiting for: the copy writes what
  // it holds of them, stops consuming them and removes them from here.
  std::set<tp> release_requests;
  bool alive = false;  // the thread keeps copies; false once it stopped or failed

  impl(ingest_config c, std::vector<view_def> v, storage::db& d, const ownership_registry& o,
       const membership_registry& m, std::string s, int r, change_notifier* n)
      : cfg(std::move(c)),
        views(std::move(v)),
        db(d),
        ownership(o),
        membership(m),
        self(std::move(s)),
        replicas(r),
        notifier(n) {}
  ~impl() {
    if (consumer) rd_kafka_destroy(consumer);
  }

  bool owned_here(const tp& p) const {
    auto t = ownership.topic(p.first);
    if (!t) return false;
    auto it = t->partitions.find(p.second);
    return it != t->partitions.end() && it->second.assigned;
  }

  // What this instance should keep as standby now, claimed partitions aside. A
  // partition is one of a view's store topic (its source, or an aggregate's repartition
  // topic, or a foreign-key join's subscription topic), as the group assigns them.
  std::set<tp> desired(const std::set<tp>& excluded) const {
    std::set<tp> out;
    auto snap = membership.current();
    std::set<std::string> topics;
    for (const auto& v : views) topics.insert(v.topic);
    for (const auto& a : aggs) topics.insert(a.def->topic);
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

  // Writes the pending batch; holds mu. A batch that touches a partition the owner
  // claimed (and is not handing over) is dropped instead: the owner may have written
  // newer values of it already. `dropped` is then set, and the caller must read the
  // kept partitions' positions again (reassign), since the consumer and the builder
  // are past what is stored.
  status write_pending(bool& dropped) {
    dropped = false;
    if (builder->pending_records() == 0 && changelog_held == 0) return status::ok_status();
    std::vector<tp> touched;
    for (const auto& [p, next] : builder->touched()) touched.push_back(p);
    for (const auto& [vp, c] : followed)
      if (c.changed) touched.emplace_back(aggs[vp.first].def->topic, vp.second);
    for (const auto& p : touched) {
      if (!claimed.count(p) || release_requests.count(p)) continue;
      log()->info("standby: dropped a batch of {} records: {}-{} was taken over by this instance",
                  builder->pending_records() + changelog_held, p.first, p.second);
      builder->reset();
      reset_changelog_batch();
      dropped = true;
      return status::ok_status();
    }
    // Rejections are the owner's to count and dead-letter; a standby only moves past them.
    if (!builder->batch().empty()) {
      if (auto s = db.write(builder->batch()); !s.ok()) return s.prefixed("RocksDB write failed");
      if (notifier) notifier->notify();
    }
    builder->reset();
    if (changelog_held > 0) {
      // As a restore's checkpoint: the state, the changelog position and stream time,
      // and the store-topic position once the copy reached the changelog's end.
      auto& batch = *changelog_batch;
      for (auto& [vp, c] : followed) {
        if (!c.changed) continue;
        const auto& a = aggs[vp.first];
        batch.set_named_position(changelog_position_name(*a.def), vp.second, c.next);
        if (a.def->windowed()) batch.set_named_position(stream_time_name(*a.def), vp.second, c.stream_time);
        if (c.input >= 0) batch.set_position(a.id, vp.second, c.input);
        c.changed = false;
      }
      if (auto s = db.write(batch); !s.ok()) return s.prefixed("RocksDB write failed");
      batch.clear();
      changelog_held = 0;
      if (notifier) notifier->notify();
    }
    return status::ok_status();
  }

  // Forgets what the changelog copies applied and did not write (a dropped batch).
  void reset_changelog_batch() {
    changelog_batch->clear();
    changelog_held = 0;
    for (auto& [vp, c] : followed) c.changed = false;
  }

  // Starts following the changelog of every aggregate view of (topic, partition) from
  // the stored positions, adding its changelog partitions to `list`; holds mu.
  status follow_changelogs(const tp& unit, rd_kafka_topic_partition_list_t* list) {
    for (size_t idx = 0; idx < aggs.size(); ++idx) {
      const auto& a = aggs[idx];
      if (a.def->topic != unit.first) continue;
      changelog_copy c;
      auto next = db.stored_named_position(changelog_position_name(*a.def), unit.second);
      if (!next.ok()) return next.error();
      c.next = next.value().value_or(0);
      if (a.def->windowed()) {
        auto st = db.stored_named_position(stream_time_name(*a.def), unit.second);
        if (!st.ok()) return st.error();
        c.stream_time = st.value().value_or(-1);
      }
      auto input = db.stored_position(a.id, unit.second);
      if (!input.ok()) return input.error();
      c.input = c.input_seen = input.value().value_or(-1);
      followed[{idx, unit.second}] = c;
      rd_kafka_topic_partition_list_add(list, a.def->changelog_topic.c_str(), unit.second)->offset =
          next.value() ? *next.value() : RD_KAFKA_OFFSET_BEGINNING;
    }
    return status::ok_status();
  }

  // The copy followed for a changelog partition, when it is kept and not claimed;
  // holds mu.
  changelog_copy* copy_of(std::string_view changelog, int32_t partition, size_t& idx) {
    auto it = by_changelog.find(changelog);
    if (it == by_changelog.end()) return nullptr;
    idx = it->second;
    tp unit{aggs[idx].def->topic, partition};
    if (!current.count(unit) || claimed.count(unit)) return nullptr;
    auto f = followed.find({idx, partition});
    return f == followed.end() ? nullptr : &f->second;
  }

  // A changelog record: applied to the changelog batch as a restore applies it.
  bool take(const rd_kafka_message_t* m) {
    std::string_view topic = rd_kafka_topic_name(m->rkt);
    if (!by_changelog.count(topic)) return false;
    std::lock_guard lock(mu);
    size_t idx = 0;
    auto* c = copy_of(topic, m->partition, idx);
    if (!c || m->offset < c->next) return true;  // not kept (any more), or applied already
    const int64_t input = apply_changelog_record(*changelog_batch, aggs[idx].target(), m->partition, m, c->stream_time);
    c->input_seen = std::max(c->input_seen, input + 1);
    c->next = m->offset + 1;
    c->changed = true;
    ++changelog_held;
    return true;
  }

  // The standby consumer reached the end of a partition. For a changelog (read
  // committed: its last stable offset), every transaction before `end` is applied
  // whole: the store-topic position the copy reached is certain.
  void at_end(const std::string& topic, int32_t partition, int64_t end) {
    std::lock_guard lock(mu);
    size_t idx = 0;
    auto* c = copy_of(topic, partition, idx);
    if (!c || end < c->next) return;
    // Transaction markers after the last record deliver nothing. A copy at the end of a
    // changelog that gave it nothing reflects, for certain, what is before offset 0.
    const int64_t input = std::max<int64_t>(c->input_seen, 0);
    if (end > c->next || input > c->input) {
      c->next = end;
      c->input = std::max(c->input, input);
      c->changed = true;
      ++changelog_held;
    }
  }

  // Writes what is pending, then assigns `want`, each partition from its stored
  // position; holds mu.
  status reassign(const std::set<tp>& want) {
    bool dropped = false;
    if (auto s = write_pending(dropped); !s.ok()) return s;
    for (const auto& p : current) builder->forget_partition(p.first, p.second);
    followed.clear();
    tpl_ptr list(rd_kafka_topic_partition_list_new(static_cast<int>(want.size())));
    for (const auto& [t, p] : want) {
      if (auto s = follow_changelogs({t, p}, list.get()); !s.ok()) return s;
      bool known = true, tables = false;
      for (const auto& v : views) {
        if (v.topic != t || v.is_aggregate()) continue;
        tables = true;
        auto stored = db.stored_position(*db.find_view(v.name), p);
        if (!stored.ok()) return stored.error();
        if (stored.value()) builder->set_view_position(t, p, v.name, *stored.value());
        else known = false;
      }
      if (!tables) continue;
      auto resume = known ? builder->resume_offset(t, p) : std::nullopt;
      // As for the owner: records before the end are re-applied (batch_builder::ttl_time),
      // and when the end cannot be read, every record is taken for one.
      int64_t low = 0, high = -1;
      const bool ends_known =
          rd_kafka_query_watermark_offsets(consumer, t.c_str(), p, &low, &high, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR;
      builder->set_catch_up(t, p, ends_known && high >= 0 ? high : std::numeric_limits<int64_t>::max());
      rd_kafka_topic_partition_list_add(list.get(), t.c_str(), p)->offset =
          resume ? *resume : RD_KAFKA_OFFSET_BEGINNING;
    }
    // A full assign: fetching starts over at these offsets, and messages fetched before
    // are discarded.
    if (auto err = rd_kafka_assign(consumer, list.get())) {
      // Nothing of `want` is consumed; the next plan tries again.
      log()->warn("standby: assign: {}", rd_kafka_err2str(err));
      current.clear();
      return status::ok_status();
    }
    if (want != current) log()->info("standby copies: {} partition(s)", want.size());
    current = want;
    return status::ok_status();
  }

  // The thread's loop (the owner's batch loop, with the claims as a fence); returns an
  // error that ends the copies.
  status run() {
    auto last_plan = std::chrono::steady_clock::time_point{};
    bool replan = false;  // a batch was dropped: positions must be read again
    batch_loop_options options{"standby consumer", static_cast<size_t>(cfg.max_batch_records), cfg.max_batch_delay, 50};
    batch_loop_hooks hooks;
    hooks.each_turn = [&]() -> status {
      // Hand-overs first: the owner is waiting for them.
      std::set<tp> releasing, excluded;
      {
        std::lock_guard lock(mu);
        releasing = release_requests;
        excluded = claimed;
      }
      auto now = std::chrono::steady_clock::now();
      if (releasing.empty() && !replan && now - last_plan < std::chrono::milliseconds(500)) return status::ok_status();
      auto want = desired(excluded);
      std::lock_guard lock(mu);
      // Claims may have come since `want` was computed.
      for (const auto& p : claimed) want.erase(p);
      if (want != current || !releasing.empty() || replan)
        if (auto s = reassign(want); !s.ok()) return s;
      replan = false;
      last_plan = now;
      if (!releasing.empty()) {
        for (const auto& p : releasing) release_requests.erase(p);
        released_cv.notify_all();
      }
      return status::ok_status();
    };
    hooks.accept = [&](const record& r) {
      tp key{std::string(r.topic), r.partition};
      std::lock_guard lock(mu);
      return current.count(key) > 0 && !claimed.count(key);
    };
    hooks.take = [&](const rd_kafka_message_t* m) { return take(m); };
    hooks.held = [&] { return changelog_held; };
    hooks.at_end = [&](const std::string& topic, int32_t partition, int64_t end) {
      at_end(topic, partition, end);
      return status::ok_status();
    };
    hooks.write = [&]() -> status {
      if (before_write_for_testing) {
        std::vector<tp> touched;
        for (const auto& [p, next] : builder->touched()) touched.push_back(p);
        {
          std::lock_guard lock(mu);
          for (const auto& [vp, c] : followed)
            if (c.changed) touched.emplace_back(aggs[vp.first].def->topic, vp.second);
        }
        before_write_for_testing(touched);
      }
      std::lock_guard lock(mu);
      bool dropped = false;
      if (auto s = write_pending(dropped); !s.ok()) return s;
      replan = replan || dropped;
      return status::ok_status();
    };
    if (auto s = run_batch_loop(consumer, *builder, running, options, hooks); !s.ok()) return s;
    std::lock_guard lock(mu);
    bool dropped = false;
    return write_pending(dropped);
  }

  // The thread's body. A failed write or an exception (a throwing change_notifier
  // subscriber, std::bad_alloc) ends the copies, never the process: the owner's
  // partitions are unaffected, and allow_stale reads find the copies as they were.
  void run_guarded() {
    status failure;
    if (auto why = guarded([&] { failure = run(); })) failure = status::internal("an exception: " + *why);
    std::lock_guard lock(mu);
    if (!failure.ok()) {
      log()->critical("standby copies stopped: {}; this instance keeps no standby copy until it restarts",
                      failure.message());
      if (m_failures) m_failures->Increment();
      builder->reset();
      reset_changelog_batch();
      current.clear();
      followed.clear();
      if (auto err = rd_kafka_assign(consumer, nullptr)) log()->warn("standby: unassign: {}", rd_kafka_err2str(err));
    }
    // release() stops waiting for a thread that is gone.
    alive = false;
    released_cv.notify_all();
  }
};

standby_engine::standby_engine(ingest_config cfg, std::vector<view_def> views, storage::db& db,
                               const ownership_registry& ownership, const membership_registry& membership,
                               std::string self_endpoint, int replicas, change_notifier* notifier,
                               prometheus::Registry* metrics)
    : impl_(std::make_unique<impl>(std::move(cfg), std::move(views), db, ownership, membership,
                                   std::move(self_endpoint), replicas, notifier)) {
  if (metrics)
    impl_->m_failures = &counter_family(*metrics, "kstate_standby_failures_total",
                                        "Times the standby copies stopped on an error (kept again after a restart)")
                             .Add({});
}

standby_engine::~standby_engine() { stop(); }

status standby_engine::start() {
  auto& i = *impl_;
  auto builder = batch_builder::create(i.db, i.views, i.cfg.max_json_depth);
  if (!builder.ok()) return builder.error();
  i.builder = std::move(builder.value());
  for (const auto& v : i.views) {
    if (!v.is_aggregate()) continue;
    auto id = i.db.find_view(v.name);
    if (!id) return status::internal("view '" + v.name + "' has no column family");
    agg_copy a{&v, *id, std::nullopt, nullptr};
    if (v.is_join()) {
      a.sides = i.db.find_view(join_sides_name(v));
      if (!a.sides) return status::internal("join view '" + v.name + "' has no column family for its sides");
      a.join = std::make_unique<joiner>(v, i.cfg.max_json_depth);
    }
    i.by_changelog[v.changelog_topic] = i.aggs.size();
    i.aggs.push_back(std::move(a));
    if (!v.is_fk_join()) continue;
    // Its right side, as the pipeline keeps it: copied from the subscription changelog.
    const auto& right = i.fk_rights.emplace_back(fk_right_view(v));
    auto right_id = i.db.find_view(right.name);
    if (!right_id) return status::internal("join view '" + v.name + "' has no column family for its right side");
    agg_copy r{&right, *right_id, std::nullopt, nullptr};
    r.fk_right = true;
    i.by_changelog[right.changelog_topic] = i.aggs.size();
    i.aggs.push_back(std::move(r));
  }
  i.changelog_batch.emplace(i.db.new_batch());
  auto consumer = create_client(i.cfg, standby_consumer_spec(i.cfg));
  if (!consumer.ok()) return consumer.error();
  i.consumer = consumer.value().release();
  i.running = true;
  {
    std::lock_guard lock(i.mu);
    i.alive = true;
  }
  i.thread = std::thread([&i] {
    name_this_thread("ks-standby");
    i.run_guarded();
  });
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
}

void standby_engine::release(const std::vector<std::pair<std::string, int32_t>>& parts) {
  auto& i = *impl_;
  // Taking mu waits for a write of the copies in progress: it cannot be undone, so it
  // must land before the owner reads the positions. From the claim on, none follows.
  std::unique_lock lock(i.mu);
  std::vector<tp> handing_over;
  for (const auto& p : parts) {
    i.claimed.insert(p);
    if (i.alive && i.current.count(p)) {
      i.release_requests.insert(p);
      handing_over.push_back(p);
    }
  }
  if (handing_over.empty()) return;
  auto handed_over = [&] {
    if (!i.alive) return true;
    for (const auto& p : handing_over)
      if (i.release_requests.count(p)) return false;
    return true;
  };
  if (!i.released_cv.wait_for(lock, i.cfg.standby_release_timeout, handed_over)) {
    log()->warn(
        "standby: the copies did not hand {} partition(s) over within {} ms; the owner resumes from the "
        "stored positions and the copies' pending write of them is dropped",
        handing_over.size(), i.cfg.standby_release_timeout.count());
    // Too late: from here the copy's batch touching them is dropped, never written.
    for (const auto& p : handing_over) i.release_requests.erase(p);
  }
}

void standby_engine::give_back(const std::vector<std::pair<std::string, int32_t>>& parts) {
  auto& i = *impl_;
  std::lock_guard lock(i.mu);
  for (const auto& p : parts) {
    i.claimed.erase(p);
    i.release_requests.erase(p);
  }
}

void standby_engine::set_before_write_for_testing(write_hook hook) {
  impl_->before_write_for_testing = std::move(hook);
}

std::optional<int64_t> standby_engine::high_watermark(const std::string& topic, int32_t partition) const {
  int64_t low = -1, high = -1;
  if (!impl_->consumer ||
      rd_kafka_get_watermark_offsets(impl_->consumer, topic.c_str(), partition, &low, &high) !=
          RD_KAFKA_RESP_ERR_NO_ERROR ||
      high < 0)
    return std::nullopt;
  return high;
}

std::vector<std::pair<std::string, int32_t>> standby_engine::partitions() const {
  std::lock_guard lock(impl_->mu);
  return {impl_->current.begin(), impl_->current.end()};
}

}  // namespace kstate::ingest
