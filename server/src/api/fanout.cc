#include "api/fanout.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>

#include "api/coalesce.h"
#include "api/render.h"
#include "http/client.h"
#include "server/problem.h"

namespace kstate::server::api {
namespace {

// A peer's answer as this instance passes it on: status, type and body, and only the
// headers kstate's own answers carry.
http::response from_owner(http::response&& r) {
  http::response out;
  out.status = r.status;
  out.content_type = std::move(r.content_type);
  out.body = std::move(r.body);
  for (auto& [n, v] : r.headers)
    if (kept_from_owner(n)) out.headers.emplace_back(std::move(n), std::move(v));
  return out;
}

void count_peer_request(const state& st, const char* kind, bool ok) {
  if (st.m_peer_requests) st.m_peer_requests->Add({{"kind", kind}, {"result", ok ? "ok" : "error"}}).Increment();
}

}  // namespace

// The owner's other headers (Set-Cookie from something in between, CORS headers made
// for another origin, Server, Date) are not ours to pass on; X-Request-Id and framing
// headers are the serving instance's own.
bool kept_from_owner(const std::string& name) {
  static const char* const kept[] = {"x-kstate-position", "x-kstate-stale", "retry-after", "link", "www-authenticate"};
  std::string lower(name);
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* k : kept)
    if (lower == k) return true;
  return false;
}

http::client_request peer_request(const state& st, const call& c, std::string method, std::string target,
                                  std::string body, std::chrono::milliseconds wait) {
  http::client_request pr;
  pr.headers = {{hop_header, "1"},
                {"X-Request-Id", c.r().request_id},
                {std::string(peer_header), st.signer()->sign(method, target, body, peer_signer::now_ms())}};
  pr.method = std::move(method);
  pr.target = std::move(target);
  pr.body = std::move(body);
  pr.deadline = clock_type::now() + st.ctx.forward_timeout + wait;
  return pr;
}

namespace {

// Asks `copies[next]` onwards, in turn, for its copy's answer to `pr` (a 200 or a 404
// ends it); when none answers, finishes with `fallback`.
void ask_copies(const state* s, http::client_request pr, std::shared_ptr<const std::vector<std::string>> copies,
                size_t next, http::response fallback, std::function<void(http::response)> finish) {
  if (next >= copies->size()) return finish(std::move(fallback));
  const std::string& to = (*copies)[next];
  auto again = pr;
  s->ctx.peers->send(to, std::move(pr),
                     [s, again = std::move(again), copies, next, fallback = std::move(fallback),
                      finish = std::move(finish)](result<http::response> r) mutable {
                       count_peer_request(*s, "forward", r.ok());
                       if (r.ok() && (r->status == 200 || r->status == 404))
                         return finish(from_owner(std::move(*r)).with_header("X-Kstate-Forwarded-To", (*copies)[next]));
                       ask_copies(s, std::move(again), std::move(copies), next + 1, std::move(fallback),
                                  std::move(finish));
                     });
}

}  // namespace

void forward(const state& st, const call& c, forward_plan plan, std::function<void(http::response)> finish) {
  const auto& req = c.r();
  std::chrono::milliseconds wait{0};
  if (c.min_position) wait = std::chrono::duration_cast<std::chrono::milliseconds>(c.wait_deadline - clock_type::now());
  // The request as the owner gets it when it goes alone: signed, with its deadline.
  auto alone = [s = &st, c, wait = std::max(wait, std::chrono::milliseconds(0))] {
    const auto& req = c.r();
    auto pr = peer_request(*s, c, req.method, req.target, req.body, wait);
    for (const char* h : {"accept", "content-type", "x-kstate-min-position"})
      if (auto v = req.header(h)) pr.headers.emplace_back(h, *v);
    return pr;
  };
  // A plain read (no body, no min_position wait) may ride in a batch with other
  // requests to the same owner (coalesce.h); it is then signed only if it goes alone.
  std::shared_ptr<forward_job> job;
  if (st.coalescer && req.method == "GET" && req.body.empty() && !c.min_position &&
      !req.header("x-kstate-min-position")) {
    job = std::make_shared<forward_job>();
    job->request = {req.target, req.header("accept"), req.header("content-type"), req.request_id};
    if (!fits_forward_batch(job->request)) job.reset();
  }
  std::optional<http::client_request> signed_request;
  std::function<http::client_request()> for_copies;
  if (job) {
    const auto deadline = clock_type::now() + st.ctx.forward_timeout;
    job->deadline = deadline;
    job->alone = [alone, deadline] {
      auto pr = alone();
      pr.deadline = deadline;
      return pr;
    };
    for_copies = job->alone;
  } else {
    signed_request = alone();
    // The same request (signed, with the same deadline) for the instances keeping copies.
    if (!plan.copies.empty()) for_copies = [pr = *signed_request] { return pr; };
  }
  const state* s = &st;
  auto answered = [s, owner = plan.owner, path = req.path, stale = std::move(plan.stale),
                   copies = std::make_shared<const std::vector<std::string>>(std::move(plan.copies)),
                   for_copies = std::move(for_copies), finish = std::move(finish)](result<http::response> r) mutable {
    count_peer_request(*s, "forward", r.ok());
    if (r.ok() && r->status != 503) {
      return finish(from_owner(std::move(*r)).with_header("X-Kstate-Forwarded-To", owner));
    }
    if (stale)
      if (auto answer = stale()) return finish(std::move(*answer));
    // The owner's 503 (catching up, rebalancing: retry later, as it says), or 503
    // not_owner when it did not answer.
    http::response refusal = r.ok()
                                 ? from_owner(std::move(*r))
                                 : problem(failure_reason::not_owner,
                                           "the owner at " + owner + " did not answer: " + r.error().message(), path);
    if (!copies->empty())
      return ask_copies(s, for_copies(), std::move(copies), 0, std::move(refusal), std::move(finish));
    finish(std::move(refusal));
  };
  if (job) {
    job->answered = std::move(answered);
    return st.coalescer->submit(plan.owner, std::move(job));
  }
  st.ctx.peers->send(plan.owner, std::move(*signed_request), std::move(answered));
}

namespace {

// Sends `pr` to `endpoints[next]` and calls `done` with the part it answers, or, when
// it gives none, tries `endpoints[next + 1]` onwards; when none does, `done` gets the
// first failure.
void ask_for_part(const state* s, http::client_request pr, std::shared_ptr<const std::vector<std::string>> endpoints,
                  size_t next, std::string path, std::optional<http::response> first_failure,
                  std::function<std::optional<std::string>()> local_copy, std::function<void(part_result)> done) {
  const std::string& to = (*endpoints)[next];
  auto again = pr;
  s->ctx.peers->send(
      to, std::move(pr),
      [s, again = std::move(again), endpoints, next, path = std::move(path), first_failure = std::move(first_failure),
       local_copy = std::move(local_copy), done = std::move(done)](result<http::response> r) mutable {
        const std::string& endpoint = (*endpoints)[next];
        count_peer_request(*s, "part", r.ok() && r->status == 200);
        http::response failure;
        if (!r.ok()) {
          failure = problem(failure_reason::not_owner,
                            "the owner at " + endpoint + " did not answer: " + r.error().message(), path);
        } else if (r->status != 200) {
          // The owner's own refusal (catching up, position not reached...).
          failure = from_owner(std::move(*r));
        } else if (r->content_type != part_media_type) {
          failure = problem(failure_reason::internal,
                            "the owner at " + endpoint + " answered its part as " + r->content_type, path);
        } else {
          return done(std::move(r->body));
        }
        if (!first_failure) first_failure = std::move(failure);
        // The first to fail is the owner (or the first copy holder): this instance's own
        // copy comes before asking further.
        if (next == 0 && local_copy)
          if (auto part = local_copy()) return done(std::move(*part));
        if (next + 1 >= endpoints->size()) return done(std::move(*first_failure));
        ask_for_part(s, std::move(again), std::move(endpoints), next + 1, std::move(path), std::move(first_failure),
                     nullptr, std::move(done));
      });
}

}  // namespace

void send_part(const state& st, const call& c, const peer_part& part, std::function<void(part_result)> done) {
  auto pr = peer_request(st, c, part.method, part.target, part.body, part.wait);
  pr.headers.emplace_back("Accept", std::string(part_media_type));
  for (const auto& h : part.headers) pr.headers.push_back(h);
  auto endpoints = std::make_shared<std::vector<std::string>>();
  endpoints->push_back(part.endpoint);
  endpoints->insert(endpoints->end(), part.copies.begin(), part.copies.end());
  ask_for_part(&st, std::move(pr), std::move(endpoints), 0, c.path(), std::nullopt, part.local_copy, std::move(done));
}

}  // namespace kstate::server::api
