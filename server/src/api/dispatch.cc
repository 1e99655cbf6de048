// The API's front door: route, authenticate, check parameters, run the handler, then
// carry out what it decided (answer, forward, wait and run locally, gather parts), and
// observe every answer once in the duration histogram.

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>

#include "api/coalesce.h"
#include "api/fanout.h"
#include "api/params.h"
#include "api/render.h"
#include "api/routes.h"
#include "api/state.h"
#include "server/api.h"
#include "server/problem.h"
#include "server/ui.h"
#include "log.h"

namespace kstate::server {
namespace api {

state::state(api_context c) : ctx(std::move(c)) {
  workers = std::make_unique<worker_pool>(ctx.limits.worker_threads, ctx.limits.max_queued_work);
  if (ctx.metrics) {
    m_duration = &prometheus::BuildHistogram()
                      .Name("kstate_http_request_duration_seconds")
                      .Help("HTTP request duration by route template, method and status")
                      .Register(*ctx.metrics);
    m_peer_requests = &prometheus::BuildCounter()
                           .Name("kstate_http_forwarded_requests_total")
                           .Help(
                               "Requests sent to other instances (kind forward: a key's owner; part: an owner's "
                               "part of a range, batch, count or cluster view), by result")
                           .Register(*ctx.metrics);
    m_forward_batches = &prometheus::BuildCounter()
                             .Name("kstate_http_forwarded_batches_total")
                             .Help(
                                 "Batches of forwarded requests sent to a key's owner, by result (ok; refused: the "
                                 "owner took no batch and its requests went alone; error: no answer)")
                             .Register(*ctx.metrics);
    m_forward_batched = &prometheus::BuildCounter()
                             .Name("kstate_http_forwarded_batched_requests_total")
                             .Help("Forwarded requests sent in batches, by the batch's result")
                             .Register(*ctx.metrics);
  }
  if (ctx.peer_batch.max_in_flight > 0) coalescer = std::make_shared<forward_coalescer>(*this, ctx.peer_batch);
}

state::~state() { feeds->wait_all(); }

prometheus::Histogram* state::duration_of(const route* r, const char* method, unsigned status) const {
  if (!m_duration) return nullptr;
  const auto key = std::make_tuple(r, method, status);
  {
    std::shared_lock lock(durations_mu_);
    if (auto it = durations_.find(key); it != durations_.end()) return it->second;
  }
  static const prometheus::Histogram::BucketBoundaries buckets{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  // Labelled by route template, never the raw path; the method from a fixed set.
  auto& h = m_duration->Add({{"route", r ? r->path_template() : std::string("unmatched")},
                             {"method", method},
                             {"status", std::to_string(status)}},
                            buckets);
  std::unique_lock lock(durations_mu_);
  durations_.emplace(key, &h);
  return &h;
}

std::shared_ptr<const peer_signer> state::signer() const {
  if (auto s = signer_.load()) return s;
  if (!ctx.secret) return nullptr;
  auto secret = ctx.secret->get();
  if (!secret) return nullptr;
  std::shared_ptr<const peer_signer> made = std::make_shared<peer_signer>(*secret);
  signer_.store(made);
  return made;
}

bool state::peer_allowed(const std::string& endpoint) const {
  if (endpoint.empty() || endpoint == ctx.instance) return false;
  const bool tls_here = ctx.instance.rfind("https://", 0) == 0;
  if (tls_here && endpoint.rfind("https://", 0) != 0) {
    server_log()->warn("not sending a request to {}: this instance speaks TLS and that endpoint does not", endpoint);
    return false;
  }
  return true;
}

namespace {

// Method label values: a fixed set, so a client inventing methods cannot create series.
const char* method_label(const std::string& m) {
  for (const char* known : {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
    if (m == known) return known;
  return "other";
}

// Memory a parked request holds: the request, the continuation, bookkeeping.
std::size_t parked_bytes(const http::request& r) {
  std::size_t n = 512 + r.target.size() + r.body.size();
  for (const auto& [k, v] : r.headers) n += k.size() + v.size() + 32;
  return n;
}

using finish_fn = std::function<void(http::response)>;

class dispatcher : public std::enable_shared_from_this<dispatcher> {
 public:
  explicit dispatcher(api_context ctx) : st_(std::make_shared<state>(std::move(ctx))) {}

  // `verified_peer`: a request of a batch another instance sent (internal_forwards),
  // whose signature was checked on the batch.
  void handle(const http::request& req, http::responder reply, bool verified_peer = false);
  // Gives the state a handle on this dispatcher (state::self), weak: the state must
  // not keep its own dispatcher alive.
  void bind_self() {
    st_->self = [w = weak_from_this()](const http::request& req, http::responder reply) {
      if (auto d = w.lock()) return d->handle(req, std::move(reply));
      reply(problem(failure_reason::shutting_down, "the API is stopping", req.path));
    };
  }

 private:
  void run(const call& c, outcome o, const finish_fn& finish);
  void run_local(const call& c, local_plan plan, const finish_fn& finish);
  void run_gather(const call& c, gather_plan plan, const finish_fn& finish);
  void run_batch(batch_plan plan, const finish_fn& finish);
  // Runs `work` on a worker thread, or answers 503 busy when the queue is full.
  void offload(const call& c, std::function<http::response()> work, const finish_fn& finish);
  // The answer when a min_position wait ended without reaching its bound.
  http::response not_reached(const call& c, query::wait_outcome o, const position& bound) const;

  std::shared_ptr<state> st_;
};

void dispatcher::handle(const http::request& req, http::responder reply, bool verified_peer) {
  const auto start = clock_type::now();
  const state& st = *st_;
  // The dashboard's static files are not API routes (and not in the OpenAPI spec).
  if (!req.segments.empty() && req.segments[0] == "ui") {
    if (st.ctx.ui_dir.empty())
      return reply(problem(failure_reason::route_not_found, "the dashboard is not installed", req.path));
    if (auto r = serve_ui(req, st.ctx.ui_dir)) return reply(std::move(*r));
  }
  std::string allow;
  auto m = match(req, allow);
  // Observe every answer once, by route, method and status.
  finish_fn finish = [st = st_, start, route = m ? m->r : nullptr, method = method_label(req.method),
                      reply = std::move(reply)](http::response r) {
    if (auto* h = st->duration_of(route, method, r.status))
      h->Observe(std::chrono::duration<double>(clock_type::now() - start).count());
    reply(std::move(r));
  };
  if (!m) {
    if (!allow.empty())
      return finish(problem(failure_reason::method_not_allowed, req.method + " is not allowed on " + req.path, req.path)
                        .with_header("Allow", allow));
    return finish(problem(failure_reason::route_not_found, "no route for " + req.method + " " + req.path, req.path));
  }
  const route& r = *m->r;

  call c;
  // The server's request is shared: kept, not copied, for an answer given later.
  c.req = req.weak_from_this().lock();
  if (!c.req) c.req = std::make_shared<const http::request>(req);
  c.store = std::move(m->store);
  c.key = std::move(m->key);
  // The internal dialect (DESIGN.md invariant 10): a request marked as a hop must be a
  // verified peer's; anything else claiming to be one is refused, never served as a
  // client's request (which could be forwarded back and forth).
  if (verified_peer) {
    c.from_peer = true;
  } else if (req.header(hop_header)) {
    auto signer = st.signer();
    if (!signer)
      return finish(problem(failure_reason::not_caught_up,
                            "this instance is starting and cannot check requests from other instances yet", req.path));
    if (!signer->verify(req, peer_signer::now_ms()))
      return finish(problem(failure_reason::bad_peer,
                            "X-Kstate-Hop is for requests between instances of the group, signed with their "
                            "shared secret; this one is not",
                            req.path));
    c.from_peer = true;
  }
  if (r.need == access::peer && !c.from_peer)
    return finish(problem(failure_reason::route_not_found, "no route for " + req.method + " " + req.path, req.path));
  // A peer's request was authorized by the instance that received it from the client.
  if (!c.from_peer)
    if (auto denied = authorize(st, req, r, c.store, c.who)) return finish(std::move(*denied));
  for (const auto& [k, v] : req.query) {
    if (r.params.count(k) || (c.from_peer && r.internal_params.count(k))) continue;
    return finish(problem(failure_reason::unknown_parameter,
                          r.internal_params.count(k) ? "'" + k + "' is set by kstate on requests between instances"
                                                     : "unknown query parameter '" + k.substr(0, 64) + "'",
                          req.path));
  }
  if (r.waits && (req.param("min_position") || req.header("x-kstate-min-position"))) {
    // The store's partition count, when the store exists and its metadata is known; an
    // unknown store is the handler's 404.
    int32_t partition_count = 0;
    if (const auto* v = st.ctx.queries->find_store(c.store))
      partition_count = st.ctx.ownership->partition_count(v->topic);
    auto bound = min_position_of(st, req, partition_count);
    if (!bound.ok()) return finish(std::move(bound).error());
    if (*bound) {
      c.min_position = std::move((*bound)->bound);
      c.wait_deadline = clock_type::now() + (*bound)->timeout;
    }
  }
  outcome o = r.fn(st, c);
  run(c, std::move(o), finish);
}

void dispatcher::run(const call& c, outcome o, const finish_fn& finish) {
  std::visit(
      [&](auto&& plan) {
        using T = std::decay_t<decltype(plan)>;
        if constexpr (std::is_same_v<T, http::response>) {
          finish(std::forward<decltype(plan)>(plan));
        } else if constexpr (std::is_same_v<T, forward_plan>) {
          forward(*st_, c, std::forward<decltype(plan)>(plan), finish);
        } else if constexpr (std::is_same_v<T, local_plan>) {
          run_local(c, std::forward<decltype(plan)>(plan), finish);
        } else if constexpr (std::is_same_v<T, batch_plan>) {
          run_batch(std::forward<decltype(plan)>(plan), finish);
        } else {
          run_gather(c, std::forward<decltype(plan)>(plan), finish);
        }
      },
      std::move(o));
}

void dispatcher::offload(const call& c, std::function<http::response()> work, const finish_fn& finish) {
  // The task owns what it needs; `st` keeps the API alive until it ran.
  bool queued = st_->workers->post([work = std::move(work), finish, st = st_] { finish(work()); });
  if (!queued)
    finish(problem(failure_reason::busy, "too many requests are waiting for a worker; retry shortly", c.path()));
}

http::response dispatcher::not_reached(const call& c, query::wait_outcome o, const position& bound) const {
  switch (o) {
    case query::wait_outcome::shutting_down:
      return problem(failure_reason::shutting_down, "the instance is shutting down; retry on another", c.path());
    case query::wait_outcome::not_here:
      return problem(failure_reason::not_owner,
                     "a partition of min_position is no longer held here (the group is rebalancing)", c.path());
    case query::wait_outcome::reached:
    case query::wait_outcome::timed_out: break;
  }
  auto body =
      problem_json(failure_reason::position_not_reached, "min_position was not applied within the timeout", c.path());
  position now;
  if (auto cur = st_->ctx.queries->current_position(c.store); cur.ok())
    now = cur.answer().filtered([&](int32_t p) { return bound.covers(p); });
  body["position"] = position_json(now);
  return problem_response(failure_reason::position_not_reached, body)
      .with_header("X-Kstate-Position", position_header(now));
}

void dispatcher::run_local(const call& c, local_plan plan, const finish_fn& finish) {
  if (plan.bound.empty()) {
    if (plan.cheap) return finish(plan.run());
    return offload(c, std::move(plan.run), finish);
  }
  auto self = shared_from_this();
  auto bound = plan.bound;
  bool parked = st_->ctx.waiter->wait(
      c.store, std::move(bound), c.wait_deadline, parked_bytes(c.r()),
      [self, c, run = std::move(plan.run), finish, bound = plan.bound](query::wait_outcome o) mutable {
        if (o != query::wait_outcome::reached) return finish(self->not_reached(c, o, bound));
        // The read happens on a worker, never on the waiter's own thread.
        self->offload(c, std::move(run), finish);
      });
  if (!parked)
    finish(problem(failure_reason::too_many_waits, "too many requests are waiting for min_position; retry shortly",
                   c.path()));
}

// The parts of one gathered answer as they arrive; the last one completes it.
struct gather_state {
  std::mutex mu;
  std::size_t pending = 0;
  std::vector<std::optional<std::string>> parts;  // by index: local first, then remote
  std::optional<http::response> failure;          // the first part that failed
  bool partial_ok = false;
  std::function<http::response(std::vector<std::string>)> merge;
  finish_fn finish;

  // Records part `i`; true for the last one to arrive.
  bool add(std::size_t i, part_result r) {
    std::lock_guard lock(mu);
    if (auto* body = std::get_if<std::string>(&r)) parts[i] = std::move(*body);
    else if (partial_ok) parts[i] = std::string();
    else if (!failure) failure = std::move(std::get<http::response>(r));
    return --pending == 0;
  }
};

void dispatcher::run_gather(const call& c, gather_plan plan, const finish_fn& finish) {
  auto g = std::make_shared<gather_state>();
  const std::size_t first_remote = plan.local ? 1 : 0;
  g->pending = first_remote + plan.remote.size();
  g->parts.resize(g->pending);
  g->merge = std::move(plan.merge);
  g->partial_ok = plan.partial_ok;
  g->finish = finish;
  auto self = shared_from_this();
  // Called once per part; the last one merges, on a worker thread.
  auto arrived = [self, c, g](std::size_t i, part_result r) {
    if (!g->add(i, std::move(r))) return;
    if (g->failure) return g->finish(std::move(*g->failure));
    self->offload(
        c,
        [g] {
          std::vector<std::string> parts;
          parts.reserve(g->parts.size());
          for (auto& p : g->parts) parts.push_back(std::move(*p));
          return g->merge(std::move(parts));
        },
        g->finish);
  };
  if (g->pending == 0) return arrived(0, std::string());  // cannot happen: a plan has a part
  for (std::size_t i = 0; i < plan.remote.size(); ++i)
    send_part(*st_, c, plan.remote[i],
              [arrived, i, first_remote](part_result r) { arrived(first_remote + i, std::move(r)); });
  if (!plan.local) return;
  // The local part, after its min_position wait, on a worker thread.
  auto local = [local = std::move(plan.local), arrived]() mutable { arrived(0, local()); };
  auto run_local_part = [self, c, local, arrived]() mutable {
    if (!self->st_->workers->post(local))
      arrived(0, problem(failure_reason::busy, "too many requests are waiting for a worker; retry shortly", c.path()));
  };
  if (plan.local_bound.empty()) return run_local_part();
  bool parked = st_->ctx.waiter->wait(
      c.store, plan.local_bound, c.wait_deadline, parked_bytes(c.r()),
      [self, c, run_local_part, arrived, bound = plan.local_bound](query::wait_outcome o) mutable {
        if (o != query::wait_outcome::reached) return arrived(0, self->not_reached(c, o, bound));
        run_local_part();
      });
  if (!parked)
    arrived(0, problem(failure_reason::too_many_waits, "too many requests are waiting for min_position; retry shortly",
                       c.path()));
}

// The answers of one batch as they arrive; the last one completes it.
struct batch_state {
  std::mutex mu;
  std::size_t pending = 0;
  std::vector<http::response> answers;
  std::function<http::response(std::vector<http::response>)> answer;
  finish_fn finish;
};

void dispatcher::run_batch(batch_plan plan, const finish_fn& finish) {
  auto b = std::make_shared<batch_state>();
  b->pending = plan.requests.size();
  b->answers.resize(plan.requests.size());
  b->answer = std::move(plan.answer);
  b->finish = finish;
  if (b->pending == 0) return finish(b->answer({}));
  // Each request goes through the whole front door (route, parameters, handler) as a
  // verified peer's; its answer may come inline, from a worker or from the waiter.
  for (std::size_t i = 0; i < plan.requests.size(); ++i)
    handle(
        *plan.requests[i],
        [b, i](http::response r) {
          {
            std::lock_guard lock(b->mu);
            b->answers[i] = std::move(r);
            if (--b->pending > 0) return;
          }
          b->finish(b->answer(std::move(b->answers)));
        },
        true);
}

}  // namespace

std::vector<route_info> api_routes_impl() {
  std::vector<route_info> out;
  for (const auto& r : routes())
    if (r.need != access::peer) out.push_back({r.method, r.path_template(), {r.params.begin(), r.params.end()}});
  return out;
}

http::async_handler make_handler(api_context ctx) {
  auto a = std::make_shared<dispatcher>(std::move(ctx));
  a->bind_self();
  return [a](const http::request& req, http::responder reply) { a->handle(req, std::move(reply)); };
}

}  // namespace api

std::vector<route_info> api_routes() { return api::api_routes_impl(); }

http::async_handler make_api_handler(api_context ctx) { return api::make_handler(std::move(ctx)); }

}  // namespace kstate::server
