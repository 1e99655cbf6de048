#pragma once
// What the API's handlers share (state), what one request is to them (call), and what a
// handler decides (outcome). Internal to the server.
//
// A handler is a plain function from (state, call) to an outcome. It never touches
// sockets, never waits, and never blocks on RocksDB beyond a point lookup: work that
// may take long is returned as a local_plan and run on a worker thread; what other
// instances must answer is returned as a forward_plan or a gather_plan, and
// dispatch.cc runs it.

#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "api/peer_auth.h"
#include "api/workers.h"
#include "core/status.h"
#include "core/types.h"
#include "http/message.h"
#include "server/api.h"
#include "server/auth.h"

namespace prometheus {
template <typename T>
class Family;
class Counter;
class Histogram;
}  // namespace prometheus

namespace kstate::server::api {

using clock_type = std::chrono::steady_clock;

struct route;
class forward_coalescer;

// The threads of open change subscriptions (changes.cc): counted against
// query.max_subscriptions, and waited for when the API is destroyed.
class feed_threads {
 public:
  // Counts one in; false when `max` are open.
  bool enter(uint32_t max);
  // Counts one out (its thread ends, or its subscription never started).
  void leave();
  uint32_t open() const;
  // Until every one is out.
  void wait_all();

 private:
  mutable std::mutex mu_;
  std::condition_variable idle_;
  uint32_t open_ = 0;
};

// The wiring (api_context) and what the API derives from it. Immutable after
// construction except the atomics; shared by every request.
struct state : std::enable_shared_from_this<state> {
  explicit state(api_context c);
  // Waits for the threads of change subscriptions, which end once their streams are
  // released (the server is stopped before the API).
  ~state();

  api_context ctx;
  std::unique_ptr<worker_pool> workers;
  // Signs and verifies requests between instances; null while the group's secret is
  // not known.
  std::shared_ptr<const peer_signer> signer() const;
  // Streaming scans open now (query.max_concurrent_scans).
  mutable std::atomic<uint32_t> open_scans{0};
  // Change subscriptions open now (query.max_subscriptions).
  std::shared_ptr<feed_threads> feeds = std::make_shared<feed_threads>();
  // This API's own handler, for work that reads through the API as a client would
  // (the snapshot of a change subscription: pages gathered from every owner). Set
  // before the first request; answers 503 once the API is gone.
  http::async_handler self;
  prometheus::Family<prometheus::Histogram>* m_duration = nullptr;
  prometheus::Family<prometheus::Counter>* m_peer_requests = nullptr;
  // Batches of forwarded requests sent, and the requests they carried, by result.
  prometheus::Family<prometheus::Counter>* m_forward_batches = nullptr;
  prometheus::Family<prometheus::Counter>* m_forward_batched = nullptr;
  // Coalesces forwarded requests to one owner (coalesce.h); null when
  // http.peer_batch.max_in_flight is 0.
  std::shared_ptr<forward_coalescer> coalescer;
  // The request duration histogram of a route (null: no route matched), a method label
  // and a status; null without metrics. Each combination is looked up in the family
  // once and kept: a request costs no label map.
  prometheus::Histogram* duration_of(const route* r, const char* method, unsigned status) const;

 private:
  mutable std::atomic<std::shared_ptr<const peer_signer>> signer_;  // made from ctx.secret when it appears
  mutable std::shared_mutex durations_mu_;
  mutable std::map<std::tuple<const route*, const char*, unsigned>, prometheus::Histogram*> durations_;

 public:
  // True when requests can be sent to other instances: a group to ask, a client to
  // ask with, and a secret to sign with.
  bool forwarding() const { return ctx.membership && ctx.peers && signer(); }
  // True when `endpoint` may be sent a request: never a plain-HTTP endpoint when this
  // instance speaks TLS (the caller's request would leave encrypted and travel on in
  // clear), never this instance itself.
  bool peer_allowed(const std::string& endpoint) const;
};

// One request, as the router matched it. Copied into continuations (cheap: the request
// itself is shared).
struct call {
  std::shared_ptr<const http::request> req;
  std::string store;                     // {store} capture, percent-decoded; empty when the route has none
  std::string key;                       // {key} capture
  std::shared_ptr<const principal> who;  // the caller, when tokens are on and it is not a peer
  // Signed by another instance of the group: internal parameters allowed, never
  // forwarded again.
  bool from_peer = false;
  // min_position (or X-Kstate-Min-Position), when the route takes it and it was given.
  std::optional<position> min_position;
  // When a min_position wait gives up (now + timeout_ms).
  clock_type::time_point wait_deadline{};

  const http::request& r() const { return *req; }
  const std::string& path() const { return req->path; }
};

// The request as it came, sent to the one instance that owns the key's partition.
struct forward_plan {
  std::string owner;
  // With allow_stale: this instance's own copy, when the owner does not answer.
  std::function<std::optional<http::response>()> stale;
  // With allow_stale: other instances that may keep a copy of the partition (its
  // standbys first), asked in turn when neither the owner nor this instance's copy
  // answers. Each answers from its own copy or not at all (the request carries
  // X-Kstate-Hop), so every answer still names its position.
  std::vector<std::string> copies;
};

// Work on this instance: run `run` on a worker thread once `bound` (partitions held
// here) is reached, or at once when `bound` is empty. `cheap` work (a point lookup, a
// page bounded by its limit) with nothing to wait for runs on the calling thread.
struct local_plan {
  position bound;
  bool cheap = false;
  std::function<http::response()> run;
};

// One owner's part of an answer: its answer, or the response that failed it.
using part_result = std::variant<std::string, http::response>;

// A request to another instance for its part of an answer.
struct peer_part {
  std::string endpoint;
  std::string method = "GET";
  std::string target;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // How long past the forwarding timeout the owner may wait for its min_position.
  std::chrono::milliseconds wait{0};
  // With allow_stale, when `endpoint` gives no part: this instance's own copy of the
  // part's partitions (nullopt when it has none), then the same request to each of
  // `copies` in turn (instances that may keep a copy; each answers from its own copy
  // or not at all).
  std::function<std::optional<std::string>()> local_copy;
  std::vector<std::string> copies;
};

// An answer made of parts from several owners: the partitions held here (after
// `local_bound`, on a worker thread) and one request per other owner, all at once;
// `merge` gets every part that succeeded, the local one first. The first part that
// failed answers instead.
struct gather_plan {
  position local_bound;
  std::function<part_result()> local;  // null: nothing held here is needed
  std::vector<peer_part> remote;
  std::function<http::response(std::vector<std::string> parts)> merge;
  // Failed parts reach `merge` as empty strings instead of answering the request (the
  // cluster view shows an instance that did not answer).
  bool partial_ok = false;
};

// Requests another instance sent together (POST /v1/internal/forwards, coalesce.h):
// each runs as that instance's own verified request, and `answer` makes one response
// of their answers, in order, once the last one arrived.
struct batch_plan {
  std::vector<std::shared_ptr<const http::request>> requests;
  std::function<http::response(std::vector<http::response>)> answer;
};

using outcome = std::variant<http::response, forward_plan, local_plan, gather_plan, batch_plan>;

using handler_fn = outcome (*)(const state&, const call&);

}  // namespace kstate::server::api
