#include "bootstrap.h"

#include <nlohmann/json.hpp>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>
#include <xxhash.h>

#include <charconv>
#include <future>
#include <thread>
#include <strings.h>

#include "api/peer_auth.h"
#include "http/client.h"
#include "log.h"
#include "snapshots.h"

namespace kstate::server {
namespace {

using clock_type = std::chrono::steady_clock;

std::optional<std::string> header_of(const http::response& r, std::string_view name) {
  for (const auto& [n, v] : r.headers)
    if (n.size() == name.size() && ::strncasecmp(n.data(), name.data(), n.size()) == 0) return v;
  return std::nullopt;
}

std::optional<uint64_t> number_header(const http::response& r, std::string_view name, int base = 10) {
  auto v = header_of(r, name);
  uint64_t n = 0;
  if (!v || std::from_chars(v->data(), v->data() + v->size(), n, base).ec != std::errc()) return std::nullopt;
  return n;
}

// (name, offset) pairs of a probe's or an open's answer; nullopt when malformed.
std::optional<view_positions> positions_from(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("positions") || !j["positions"].is_array()) return std::nullopt;
  view_positions out;
  for (const auto& p : j["positions"]) {
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string() || !p.contains("offset") ||
        !p["offset"].is_number_integer())
      return std::nullopt;
    out.emplace_back(p["name"].get<std::string>(), p["offset"].get<int64_t>());
  }
  return out;
}

std::optional<int64_t> own_position(const view_positions& positions, const std::string& view) {
  for (const auto& [name, offset] : positions)
    if (name == view) return offset;
  return std::nullopt;
}

// True when a probe's or an open's answer says the copy carries a join view's sides.
bool carries_sides(const nlohmann::json& j) {
  return j.is_object() && j.contains("sides") && j["sides"].is_boolean() && j["sides"].get<bool>();
}

// The topic partition a view's state is kept by: its own topic for a table view, the
// topic its aggregate is computed from (the repartition topic of a re-keyed one).
const std::string& state_topic(const view_def& v) {
  if (!v.is_aggregate()) return v.topic;
  return v.rekeyed() ? v.repartition_topic : v.input_topic();
}

}  // namespace

// One instance's copy of a partition, as its probe described it.
struct bootstrapper::source {
  std::string endpoint;
  int64_t position = -1;
};

bootstrapper::bootstrapper(bootstrap_config cfg, std::vector<view_def> views, storage::db& db,
                           const membership_registry& membership, http::client& peers,
                           std::shared_ptr<const peer_secret> secret, std::string self,
                           const std::atomic<bool>& stopping, prometheus::Registry* metrics)
    : cfg_(cfg),
      views_(std::move(views)),
      db_(db),
      membership_(membership),
      peers_(peers),
      secret_(std::move(secret)),
      self_(std::move(self)),
      stopping_(stopping) {
  if (metrics) {
    m_copies_ = &prometheus::BuildCounter()
                     .Name("kstate_bootstrap_copies_total")
                     .Help(
                         "Partitions of a store this instance took over and copied from another instance, by "
                         "result (installed, failed: rebuilt from Kafka instead)")
                     .Register(*metrics);
    m_entries_ = &prometheus::BuildCounter()
                      .Name("kstate_bootstrap_entries_total")
                      .Help("Entries installed from copies of partitions sent by other instances")
                      .Register(*metrics);
  }
}

void bootstrapper::run(const std::vector<std::pair<std::string, int32_t>>& parts) {
  if (!cfg_.enabled || parts.empty()) return;
  const auto deadline = clock_type::now() + cfg_.timeout;
  for (const auto& [topic, partition] : parts)
    for (const auto& v : views_) {
      if (state_topic(v) != topic) continue;
      // A foreign-key join's state spans two topics' partitions (its left rows and its
      // right side, whose positions share the view's name prefix): a copy of one would
      // leave them apart. Both restore from their changelogs instead.
      if (v.is_fk_join()) continue;
      if (stopping_ || clock_type::now() >= deadline) return;
      auto r = copy(v, partition, deadline);
      if (r == outcome::skipped) continue;
      if (r == outcome::installed) ++installed_;
      else ++failed_;
      if (m_copies_)
        m_copies_->Add({{"store", v.name}, {"result", r == outcome::installed ? "installed" : "failed"}}).Increment();
    }
}

bootstrapper::outcome bootstrapper::copy(const view_def& v, int32_t partition, clock_type::time_point deadline) {
  auto id = db_.find_view(v.name);
  if (!id) return outcome::skipped;
  auto local = db_.stored_position(*id, partition);
  if (!local.ok()) return outcome::skipped;  // ingest reports it when it reads the same position
  // A join view's state is two column families, its joined values and each key's sides
  // (from which later records are joined): a copy carries both, or is not installed.
  std::vector<storage::view_id> companions;
  if (v.is_join()) {
    auto sides = db_.find_view(join_sides_name(v));
    if (!sides) return outcome::skipped;  // never: the sides' column family is made with the view's
    companions.push_back(*sides);
  }

  // The other members that could hold a copy; none (a restart of the only instance):
  // nothing to ask, and nothing to wait for.
  const bool tls_here = self_.rfind("https://", 0) == 0;
  std::vector<std::string> others;
  auto members = membership_.current();
  for (const auto& m : members->members) {
    if (m.endpoint.empty() || m.endpoint == self_) continue;
    if (tls_here && m.endpoint.rfind("https://", 0) != 0) continue;
    others.push_back(m.endpoint);
  }
  if (others.empty()) return outcome::skipped;

  // Requests are signed like every request between instances; without the group's
  // secret (not read yet) there is nobody to ask.
  auto secret = secret_ ? secret_->get() : nullptr;
  for (int i = 0; !secret && secret_ && i < 50 && !stopping_; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    secret = secret_->get();
  }
  if (!secret) return outcome::skipped;
  api::peer_signer signer(*secret);
  auto request = [&](std::string method, std::string target, clock_type::time_point until) {
    http::client_request r;
    r.headers = {{"X-Kstate-Hop", "1"},
                 {std::string(api::peer_header), signer.sign(method, target, "", api::peer_signer::now_ms())}};
    r.method = std::move(method);
    r.target = std::move(target);
    r.deadline = std::min(until, deadline);
    return r;
  };
  auto send = [&](const std::string& endpoint, http::client_request r) {
    auto p = std::make_shared<std::promise<result<http::response>>>();
    auto f = p->get_future();
    peers_.send(endpoint, std::move(r), [p](result<http::response> got) { p->set_value(std::move(got)); });
    return f;
  };
  const std::string base = "/v1/stores/" + v.name + "/partitions/" + std::to_string(partition) + "/snapshot";

  // Which instances hold a copy, and how far each reaches: the furthest one is copied.
  std::vector<std::pair<std::string, std::future<result<http::response>>>> probes;
  for (const auto& endpoint : others)
    probes.emplace_back(endpoint, send(endpoint, request("GET", base, clock_type::now() + std::chrono::seconds(5))));
  source best;
  for (auto& [endpoint, f] : probes) {
    auto r = f.get();
    // 503: that instance is starting (it cannot check signed requests until it has read
    // the group's secret) or busy. Asked again for a while, or a copy an instance is
    // about to be able to send would be given up for a full rebuild.
    const auto give_up = std::min(deadline, clock_type::now() + std::chrono::seconds(10));
    while (r.ok() && r->status == 503 && !stopping_ && clock_type::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      r = send(endpoint, request("GET", base, clock_type::now() + std::chrono::seconds(5))).get();
    }
    if (!r.ok() || r->status != 200) {
      server_log()->info("store {} partition {}: {} has no copy to offer ({})", v.name, partition, endpoint,
                         r.ok() ? "status " + std::to_string(r->status) : r.error().message());
      continue;
    }
    auto j = nlohmann::json::parse(r->body, nullptr, false);
    auto positions = positions_from(j);
    if (!positions) continue;
    if (v.is_join() && !carries_sides(j)) {
      // An instance whose copies hold only the joined values: without the sides, later
      // records could not be joined. The partition restores from its changelog instead.
      server_log()->info("store {} partition {}: {} offers a copy without the join's sides", v.name, partition,
                         endpoint);
      continue;
    }
    auto pos = own_position(*positions, v.name);
    if (pos && *pos > best.position) best = {endpoint, *pos};
  }
  const int64_t here = local->value_or(0);
  if (best.position < 0 || best.position - here < cfg_.min_offsets) return outcome::skipped;

  auto fail = [&](const std::string& why) {
    server_log()->warn("copying store {} partition {} from {} failed: {}; rebuilding it from Kafka instead", v.name,
                       partition, best.endpoint, why);
    return outcome::failed;
  };
  const auto started = clock_type::now();
  auto opened = send(best.endpoint, request("POST", base, clock_type::now() + cfg_.page_timeout)).get();
  if (!opened.ok()) return fail(opened.error().message());
  if (opened->status != 200) return fail("the copy was refused with status " + std::to_string(opened->status));
  auto offer = nlohmann::json::parse(opened->body, nullptr, false);
  auto positions = positions_from(offer);
  if (!positions || !offer.contains("session") || !offer["session"].is_string() || !own_position(*positions, v.name))
    return fail("the offer is malformed");
  if (v.is_join() && !carries_sides(offer)) return fail("the offer does not carry the join's sides");
  const std::string session = offer["session"].get<std::string>();

  auto loader = db_.load_partition(*id, partition, companions);
  if (!loader.ok()) return fail(loader.error().to_string());
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> hash(XXH64_createState(), &XXH64_freeState);
  XXH64_reset(hash.get(), 0);
  auto page = [&](uint64_t n) {
    return send(best.endpoint, request("GET", base + "?session=" + session + "&page=" + std::to_string(n),
                                       clock_type::now() + cfg_.page_timeout));
  };
  uint64_t n = 0, sides = 0;
  auto next = page(0);
  for (;;) {
    auto r = next.get();
    if (!r.ok()) return fail("page " + std::to_string(n) + ": " + r.error().message());
    if (r->status != 200) return fail("page " + std::to_string(n) + " answered status " + std::to_string(r->status));
    const bool last = header_of(*r, "X-Kstate-Snapshot-Last").has_value();
    // The next page travels while this one is written.
    if (!last) next = page(n + 1);
    uint64_t frames = 0;
    auto s = for_each_snapshot_frame(r->body, [&](std::string_view key, std::string_view value, snapshot_frame kind) {
      ++frames;
      switch (kind) {
        case snapshot_frame::version: return (*loader)->add_version(key, value);
        case snapshot_frame::side: ++sides; return (*loader)->add_companion(0, key, value);  // none: refused
        case snapshot_frame::entry: break;
      }
      return (*loader)->add(key, value);
    });
    if (!s.ok()) return fail("page " + std::to_string(n) + ": " + s.to_string());
    if (number_header(*r, "X-Kstate-Snapshot-Entries") != frames)
      return fail("page " + std::to_string(n) + " holds another number of entries than it says");
    XXH64_update(hash.get(), r->body.data(), r->body.size());
    ++n;
    if (last) {
      if (number_header(*r, "X-Kstate-Snapshot-Total") != (*loader)->entries())
        return fail("the copy holds " + std::to_string((*loader)->entries()) + " entries, not the number sent");
      if (number_header(*r, "X-Kstate-Snapshot-Digest", 16) != XXH64_digest(hash.get()))
        return fail("the checksum of the pages received does not match the sender's");
      // A join's copy says how many sides it sent: a copy without that count (a sender
      // that does not send sides) or with another number is never installed half.
      if (v.is_join() && number_header(*r, "X-Kstate-Snapshot-Sides") != sides)
        return fail("the copy holds " + std::to_string(sides) + " sides of the join, not the number sent");
      break;
    }
    if (stopping_) return fail("stopping");
    if (clock_type::now() >= deadline) return fail("out of time (peer_bootstrap.timeout_ms)");
  }
  if (auto s = (*loader)->commit(*positions); !s.ok()) return fail("installing: " + s.to_string());
  const double secs = std::chrono::duration<double>(clock_type::now() - started).count();
  server_log()->info(
      "store {} partition {}: installed a copy from {} at position {} ({} entries, {} bytes, {} pages, {:.2f} s); "
      "Kafka is read from there",
      v.name, partition, best.endpoint, *own_position(*positions, v.name), (*loader)->entries(), (*loader)->bytes(), n,
      secs);
  if (m_entries_) m_entries_->Add({{"store", v.name}}).Increment(static_cast<double>((*loader)->entries()));
  return outcome::installed;
}

}  // namespace kstate::server
