#include "api/coalesce.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>

#include <algorithm>

#include "api/fanout.h"
#include "api/handlers.h"
#include "http/url.h"
#include "server/problem.h"
#include "log.h"

namespace kstate::server::api {
namespace {

// How long an owner that refused a batch is sent requests alone.
constexpr auto alone_after_refusal = std::chrono::seconds(30);
// A batch's body stays well under any owner's http.max_body_bytes (1 MiB by default):
// requests beyond it wait for the next exchange.
constexpr std::size_t max_batch_request_bytes = 256 * 1024;

// An owner of an earlier version, without the batch route: it answers 404 or 405, or
// something that is not a batch's answer. Other refusals (401, 413, 503) concern this
// batch only.
bool lacks_batch_route(const http::response& r) {
  return r.status == 404 || r.status == 405 || (r.status == 200 && r.content_type != forwards_media_type);
}

std::size_t framed_size(const forward_sub_request& r) {
  return 17 + r.target.size() + r.accept.value_or("").size() + r.content_type.value_or("").size() + r.request_id.size();
}

}  // namespace

forward_coalescer::forward_coalescer(const state& st, peer_batch_config cfg) : st_(st), cfg_(cfg) {}

void forward_coalescer::submit(const std::string& endpoint, std::shared_ptr<forward_job> job) {
  bool now = false, counted = true;
  {
    std::lock_guard lock(mu_);
    auto& e = endpoints_[endpoint];
    if (e.alone_until > clock_type::now()) {
      now = true;
      counted = false;
    } else if (e.in_flight < cfg_.max_in_flight) {
      ++e.in_flight;
      now = true;
    } else {
      e.waiting.push_back(std::move(job));
    }
  }
  if (now) send_alone(endpoint, std::move(job), counted);
}

void forward_coalescer::send_alone(const std::string& endpoint, std::shared_ptr<forward_job> job, bool counted) {
  auto self = shared_from_this();
  auto pr = job->alone();  // before `job` moves into the continuation
  st_.ctx.peers->send(endpoint, std::move(pr),
                      [self, endpoint, job = std::move(job), counted](result<http::response> r) {
                        // What waits goes first: its requests have waited longer than this
                        // answer takes to pass on.
                        if (counted) self->ended(endpoint);
                        job->answered(std::move(r));
                      });
}

void forward_coalescer::ended(const std::string& endpoint) {
  jobs next;
  bool each_alone = false;
  {
    std::lock_guard lock(mu_);
    auto& e = endpoints_[endpoint];
    --e.in_flight;
    if (e.waiting.empty()) return;
    if (e.alone_until > clock_type::now()) {
      // The owner takes no batches: what waits goes now, each request alone.
      each_alone = true;
      next.assign(std::make_move_iterator(e.waiting.begin()), std::make_move_iterator(e.waiting.end()));
      e.waiting.clear();
    } else {
      if (e.in_flight >= cfg_.max_in_flight) return;
      std::size_t bytes = 0;
      while (!e.waiting.empty() && next.size() < cfg_.max_requests) {
        bytes += framed_size(e.waiting.front()->request);
        if (!next.empty() && bytes > max_batch_request_bytes) break;
        next.push_back(std::move(e.waiting.front()));
        e.waiting.pop_front();
      }
      ++e.in_flight;
    }
  }
  if (each_alone) {
    for (auto& j : next) send_alone(endpoint, std::move(j), false);
    return;
  }
  if (next.size() == 1) return send_alone(endpoint, std::move(next.front()), true);
  send_batch(endpoint, std::move(next));
}

void forward_coalescer::refused(const std::string& endpoint) {
  std::lock_guard lock(mu_);
  endpoints_[endpoint].alone_until = clock_type::now() + alone_after_refusal;
}

void forward_coalescer::send_batch(const std::string& endpoint, jobs batch) {
  std::vector<forward_sub_request> requests;
  requests.reserve(batch.size());
  auto deadline = batch.front()->deadline;
  for (const auto& j : batch) {
    requests.push_back(j->request);
    deadline = std::min(deadline, j->deadline);
  }
  http::client_request pr;
  pr.method = "POST";
  pr.target = std::string(forwards_target);
  pr.body = encode_forward_requests(requests);
  pr.deadline = deadline;
  const auto signer = st_.signer();  // set before anything was forwarded; never unset
  if (!signer) {
    ended(endpoint);
    for (auto& j : batch) j->answered(status::unavailable("the group's secret is not known"));
    return;
  }
  pr.headers = {{hop_header, "1"},
                {"X-Request-Id", batch.front()->request.request_id},
                {"Content-Type", std::string(forwards_media_type)},
                {"Accept", std::string(forwards_media_type)},
                {std::string(peer_header), signer->sign(pr.method, pr.target, pr.body, peer_signer::now_ms())}};
  auto self = shared_from_this();
  st_.ctx.peers->send(endpoint, std::move(pr),
                      [self, endpoint, batch = std::move(batch)](result<http::response> r) mutable {
                        // Known before the next exchange starts, so that it does not
                        // carry a batch the owner refuses too.
                        if (r.ok() && lacks_batch_route(*r)) self->refused(endpoint);
                        self->ended(endpoint);
                        self->batch_answered(endpoint, batch, std::move(r));
                      });
}

void forward_coalescer::batch_answered(const std::string& endpoint, jobs& batch, result<http::response> r) {
  if (!r.ok()) {
    // As if each request had failed on its own exchange (the owner is down, or did not
    // answer in time): each takes its own way on (its stale copy, other copies, 503).
    count_batch("error", batch.size());
    for (auto& j : batch) j->answered(r.error());
    return;
  }
  std::optional<std::vector<forward_sub_response>> answers;
  if (r->status == 200 && r->content_type == forwards_media_type) {
    if (auto decoded = decode_forward_responses(r->body); decoded.ok() && decoded->size() == batch.size())
      answers = std::move(*decoded);
  }
  if (!answers) {
    // The owner does not take batches (an older version), or refused this one: each
    // request goes alone, as it would have without coalescing.
    server_log()->debug("{} answered a batch of {} forwarded requests with {} {}: sending them alone", endpoint,
                        batch.size(), r->status, r->content_type);
    count_batch("refused", batch.size());
    for (auto& j : batch) send_alone(endpoint, std::move(j), false);
    return;
  }
  count_batch("ok", batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    auto& a = (*answers)[i];
    // Not carried (streamed, or too large for the batch): asked again, alone.
    if (a.status == 0) {
      send_alone(endpoint, std::move(batch[i]), false);
      continue;
    }
    http::response one;
    one.status = a.status;
    one.content_type = std::move(a.content_type);
    one.headers = std::move(a.headers);
    one.body = std::move(a.body);
    batch[i]->answered(std::move(one));
  }
}

void forward_coalescer::count_batch(const char* result, std::size_t requests) const {
  if (st_.m_forward_batches) st_.m_forward_batches->Add({{"result", result}}).Increment();
  if (st_.m_forward_batched) st_.m_forward_batched->Add({{"result", result}}).Increment(static_cast<double>(requests));
}

// --- owner side -------------------------------------------------------------------

namespace {

// Request ids end up in logs: only short, boring ones are taken from a peer (as the
// server takes them from clients).
bool sane_request_id(std::string_view id) {
  if (id.empty() || id.size() > max_forward_request_id_bytes) return false;
  return std::all_of(id.begin(), id.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '.' || c == '_' || c == '-'; });
}

}  // namespace

outcome internal_forwards(const state& st, const call& c) {
  const auto& req = c.r();
  if (req.header("content-type").value_or("") != forwards_media_type)
    return problem(failure_reason::unsupported_media,
                   "a batch of forwarded requests is " + std::string(forwards_media_type), c.path());
  auto decoded = decode_forward_requests(req.body);
  if (!decoded.ok()) return problem(failure_reason::bad_body, decoded.error().message(), c.path());
  batch_plan plan;
  plan.requests.reserve(decoded->size());
  for (auto& sub : *decoded) {
    auto one = std::make_shared<http::request>();
    one->method = "GET";
    one->target = std::move(sub.target);
    // The same parser as the server's: a request in a batch sees exactly the routes,
    // parameters and limits it would see alone.
    if (auto s = http::parse_target(one->target, *one); !s.ok())
      return problem(failure_reason::bad_body, "a request of the batch has a bad target: " + s.message(), c.path());
    if (sub.accept) one->headers.emplace_back("accept", std::move(*sub.accept));
    if (sub.content_type) one->headers.emplace_back("content-type", std::move(*sub.content_type));
    if (sane_request_id(sub.request_id)) one->request_id = std::move(sub.request_id);
    else one->request_id = req.request_id;
    one->headers.emplace_back("x-request-id", one->request_id);
    plan.requests.push_back(std::move(one));
  }
  // At most one answer's worth of bytes in the batch; what does not fit is asked again
  // alone, as is a streamed answer (its body is made piece by piece).
  plan.answer = [max_bytes = st.ctx.limits.max_response_bytes](std::vector<http::response> answers) {
    std::vector<forward_sub_response> out(answers.size());
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < answers.size(); ++i) {
      auto& a = answers[i];
      if (a.stream || a.content_type.size() > max_forward_header_bytes) continue;
      std::vector<std::pair<std::string, std::string>> kept;
      std::size_t size = a.body.size() + a.content_type.size();
      bool fits = true;
      for (auto& [n, v] : a.headers) {
        if (!kept_from_owner(n)) continue;
        fits = fits && kept.size() < max_forward_response_headers && n.size() <= max_forward_response_header_bytes &&
               v.size() <= max_forward_response_header_bytes;
        size += n.size() + v.size();
        kept.emplace_back(std::move(n), std::move(v));
      }
      if (!fits || bytes + size > max_bytes) continue;
      bytes += size;
      auto& o = out[i];
      o.status = a.status;
      o.content_type = std::move(a.content_type);
      o.headers = std::move(kept);
      o.body = std::move(a.body);
    }
    http::response r;
    r.content_type = std::string(forwards_media_type);
    r.body = encode_forward_responses(out);
    return r;
  };
  return plan;
}

}  // namespace kstate::server::api
