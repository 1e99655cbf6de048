#pragma once
// Coalescing forwarded requests to one owner, group-commit style.
//
// Forwarder side (forward_coalescer): per owner endpoint, a count of exchanges under way
// and a queue. A forwarded GET goes at once, alone, while fewer than
// http.peer_batch.max_in_flight exchanges to its owner are under way; otherwise it
// waits, and each time an exchange to that owner ends, the waiting requests go
// together as one POST /v1/internal/forwards (forward_batch.h), at most max_requests
// of them (a lone waiting request goes alone). At low load nothing waits; under load
// the requests ride together and the owner answers them in one exchange.
//
// Every answer, alone or from a batch, goes through the request's own continuation
// (forward_job::answered), so a client cannot tell them apart. An owner that refuses
// the batch (an older version without the route, a batch over its body limit, any
// answer other than 200 with the batch media type) gets that batch's requests one by
// one; a batch that fails in transit fails each of its requests as if each had.
//
// Owner side: the route's handler (internal_forwards, handlers.h) turns the batch into
// a batch_plan; dispatch.cc runs each request as a verified peer's own.
//
// Thread safety: submit() from any thread; the continuations run on the peer client's
// threads. The coalescer keeps a pointer to the state, which outlives the requests
// sent on its behalf (as for every forwarded request, fanout.cc).

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/forward_batch.h"
#include "api/state.h"
#include "http/client.h"

namespace kstate::server::api {

// One forwarded request, as the coalescer carries it.
struct forward_job {
  // What a batch carries of it.
  forward_sub_request request;
  // The deadline of its exchange, set when it was forwarded (a batch takes its
  // earliest).
  clock_type::time_point deadline;
  // The request alone, signed, with that deadline.
  std::function<http::client_request()> alone;
  // The owner's answer to it, or the failure of its exchange. Called exactly once.
  std::function<void(result<http::response>)> answered;
};

class forward_coalescer : public std::enable_shared_from_this<forward_coalescer> {
 public:
  // `cfg.max_in_flight` must be at least 1 (0 means no coalescer at all).
  forward_coalescer(const state& st, peer_batch_config cfg);

  // Sends `job` to `endpoint` now, or when an exchange to it ends.
  void submit(const std::string& endpoint, std::shared_ptr<forward_job> job);

 private:
  using jobs = std::vector<std::shared_ptr<forward_job>>;
  struct endpoint_state {
    uint32_t in_flight = 0;
    std::deque<std::shared_ptr<forward_job>> waiting;
    // An owner that refused a batch is sent requests alone until then (an older
    // version during a rolling upgrade).
    clock_type::time_point alone_until{};
  };

  // One exchange to `endpoint`, counted in its in_flight when `counted`.
  void send_alone(const std::string& endpoint, std::shared_ptr<forward_job> job, bool counted);
  void send_batch(const std::string& endpoint, jobs batch);
  void batch_answered(const std::string& endpoint, jobs& batch, result<http::response> r);
  // A counted exchange to `endpoint` ended: the next one starts with what waits.
  void ended(const std::string& endpoint);
  // `endpoint` refused a batch: requests to it go alone for a while.
  void refused(const std::string& endpoint);
  void count_batch(const char* result, std::size_t requests) const;

  const state& st_;
  const peer_batch_config cfg_;
  std::mutex mu_;
  std::map<std::string, endpoint_state> endpoints_;  // guarded by mu_
};

}  // namespace kstate::server::api
