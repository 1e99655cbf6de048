#include "ingest/membership.h"

#include "kafka_common.h"

#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string_view>
#include <thread>

#include "core/guard.h"
#include "core/thread_name.h"

namespace kstate::ingest {
namespace {

// The separator between the client id and the fields after it, and the one field
// kstate writes. Other fields (from a later version) are skipped by the parser.
constexpr char field_sep = ';';
constexpr std::string_view endpoint_field = "endpoint=";

bool needs_escape(unsigned char c) { return c == '%' || c == field_sep || c < 0x21 || c > 0x7e; }

std::string escape(std::string_view s) {
  static const char* digits = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (needs_escape(c)) {
      out += '%';
      out += digits[c >> 4];
      out += digits[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;  // truncated escape
    int hi = hex_value(s[i + 1]), lo = hex_value(s[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

bool same_members(const std::vector<member_info>& a, const std::vector<member_info>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& x = a[i];
    const auto& y = b[i];
    if (x.member_id != y.member_id || x.client_id != y.client_id || x.endpoint != y.endpoint || x.host != y.host ||
        x.partitions != y.partitions)
      return false;
  }
  return true;
}

// Rebalance callbacks come in bursts (cooperative rebalancing revokes, then assigns);
// refreshes prompted by them are at least this far apart.
constexpr std::chrono::milliseconds min_refresh_gap{100};

}  // namespace

std::optional<std::vector<std::pair<std::string, int32_t>>> decode_consumer_assignment(const void* data, size_t size) {
  // ConsumerProtocolAssignment (every version): int16 version, then an array (int32
  // count) of {string topic (int16 length), array of int32 partition}, then fields this
  // reader does not need (user data). Big-endian throughout.
  const auto* p = static_cast<const unsigned char*>(data);
  size_t at = 0;
  auto take = [&](size_t n, uint64_t& out) {
    if (size - at < n) return false;
    out = 0;
    for (size_t i = 0; i < n; ++i) out = out << 8 | p[at + i];
    at += n;
    return true;
  };
  uint64_t version = 0, topics = 0;
  if (!take(2, version) || static_cast<int16_t>(version) < 0 || !take(4, topics)) return std::nullopt;
  if (static_cast<int32_t>(topics) < 0) return std::nullopt;
  std::vector<std::pair<std::string, int32_t>> out;
  for (uint64_t t = 0; t < topics; ++t) {
    uint64_t len = 0, count = 0;
    if (!take(2, len) || static_cast<int16_t>(len) < 0 || size - at < len) return std::nullopt;
    std::string topic(reinterpret_cast<const char*>(p + at), len);
    at += len;
    if (!take(4, count) || static_cast<int32_t>(count) < 0 || (size - at) / 4 < count) return std::nullopt;
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t partition = 0;
      take(4, partition);
      if (static_cast<int32_t>(partition) < 0) return std::nullopt;
      out.emplace_back(topic, static_cast<int32_t>(partition));
    }
  }
  return out;
}

std::string encode_member_client_id(const std::string& client_id, const std::string& endpoint) {
  std::string out = escape(client_id);
  if (endpoint.empty()) return out;
  out += field_sep;
  out += endpoint_field;
  out += escape(endpoint);
  return out;
}

std::optional<std::string> endpoint_from_client_id(const std::string& client_id) {
  std::string_view rest(client_id);
  auto sep = rest.find(field_sep);
  if (sep == std::string_view::npos) return std::nullopt;
  rest.remove_prefix(sep + 1);  // the client id proper is not needed
  while (true) {
    auto end = rest.find(field_sep);
    auto field = rest.substr(0, end);
    if (field.substr(0, endpoint_field.size()) == endpoint_field) {
      auto endpoint = unescape(field.substr(endpoint_field.size()));
      if (!endpoint || endpoint->empty()) return std::nullopt;
      return endpoint;
    }
    if (end == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(end + 1);
  }
}

struct membership_watcher::impl {
  // Outcome of one describe request; decides when the next one is due.
  enum class outcome { settled, unsettled, failed, stopping };

  ingest_config kafka_cfg;
  membership_config cfg;
  membership_registry& registry;

  rd_kafka_t* rk = nullptr;
  std::thread thread;

  std::mutex mu;
  std::condition_variable cv;
  bool wake = false;      // guarded by mu
  bool stop_req = false;  // guarded by mu
  std::atomic<bool> stopping{false};
  std::atomic<bool> stopped{false};
  std::atomic<uint64_t> failures{0};

  // Touched only by the watcher thread.
  bool have_published = false;
  cluster_snapshot last;
  bool failing = false;

  impl(const ingest_config& k, membership_config c, membership_registry& r) : kafka_cfg(k), cfg(c), registry(r) {}

  ~impl() {
    if (rk) rd_kafka_destroy(rk);
  }

  status create_handle() {
    auto client = create_client(kafka_cfg, membership_client_spec(), [](rd_kafka_conf_t* conf) {
      rd_kafka_conf_set_error_cb(conf, [](rd_kafka_t*, int err, const char* reason, void*) {
        log()->debug("membership librdkafka error: {}: {}", rd_kafka_err2str(static_cast<rd_kafka_resp_err_t>(err)),
                     reason);
      });
    });
    if (!client.ok()) return client.error();
    rk = client.value().release();
    return status::ok_status();
  }

  void note_failure(const std::string& what) {
    ++failures;
    if (!failing)
      log()->warn("describing group '{}' failed: {}; retrying every {} ms", kafka_cfg.application_id, what,
                  cfg.refresh_interval.count());
    else log()->debug("describing group '{}' failed again: {}", kafka_cfg.application_id, what);
    failing = true;
  }

  // The group is described with rd_kafka_list_groups (ListGroups to each broker, then
  // DescribeGroups to the one that coordinates the group), not with the
  // DescribeConsumerGroups admin request: librdkafka's coordinator-targeted admin
  // requests abort the process (`eonce->refcnt > 0`) when the coordinator's
  // connection drops while one is being sent, which a broker restart does.
  // The call blocks for at most the request timeout.
  outcome refresh() {
    const std::string& group = kafka_cfg.application_id;
    auto asked_at = std::chrono::system_clock::now();
    const rd_kafka_group_list* list = nullptr;
    auto err = rd_kafka_list_groups(rk, group.c_str(), &list, static_cast<int>(cfg.request_timeout.count()));
    std::unique_ptr<const rd_kafka_group_list, void (*)(const rd_kafka_group_list*)> owned(
        list, [](const rd_kafka_group_list* l) {
          if (l) rd_kafka_group_list_destroy(l);
        });
    if (stopping) return outcome::stopping;
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      // __PARTIAL: a broker did not answer in time. Its answer might be the one that
      // describes the group, so a partial list is no description.
      note_failure(rd_kafka_err2str(err));
      return outcome::failed;
    }
    const rd_kafka_group_info* desc = nullptr;
    for (int i = 0; list && i < list->group_cnt; ++i) {
      const auto& g = list->groups[i];
      if (!g.group || group != g.group) continue;
      if (g.err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        note_failure(rd_kafka_err2str(g.err));
        return outcome::failed;
      }
      desc = &g;
    }

    cluster_snapshot s;
    s.read_at = asked_at;
    // A group no broker lists has no members: Dead, as the coordinator calls it.
    auto state =
        desc && desc->state ? rd_kafka_consumer_group_state_code(desc->state) : RD_KAFKA_CONSUMER_GROUP_STATE_DEAD;
    s.group_state = desc && desc->state ? desc->state : rd_kafka_consumer_group_state_name(state);
    const bool consumer_protocol = desc && desc->protocol_type && std::string_view(desc->protocol_type) == "consumer";
    for (int i = 0; desc && i < desc->member_cnt; ++i) {
      const auto& m = desc->members[i];
      member_info info;
      auto str = [](const char* p) { return p ? std::string(p) : std::string(); };
      info.member_id = str(m.member_id);
      info.client_id = str(m.client_id);
      info.host = str(m.client_host);
      info.endpoint = endpoint_from_client_id(info.client_id).value_or("");
      if (consumer_protocol && m.member_assignment_size > 0) {
        auto parts = decode_consumer_assignment(m.member_assignment, static_cast<size_t>(m.member_assignment_size));
        if (!parts) {
          note_failure("member " + info.member_id + " has an assignment that does not decode");
          return outcome::failed;
        }
        info.partitions = std::move(*parts);
      }
      std::sort(info.partitions.begin(), info.partitions.end());
      s.members.push_back(std::move(info));
    }
    // The coordinator's member order is not meaningful; sorted, equal groups compare equal.
    std::sort(s.members.begin(), s.members.end(),
              [](const member_info& a, const member_info& b) { return a.member_id < b.member_id; });

    if (failing) log()->info("describing group '{}' works again", group);
    failing = false;
    publish_if_changed(std::move(s));
    // Empty and Dead are settled too (no members, nothing will change by itself); only a
    // rebalance in progress is worth asking about again soon.
    bool rebalancing = state == RD_KAFKA_CONSUMER_GROUP_STATE_PREPARING_REBALANCE ||
                       state == RD_KAFKA_CONSUMER_GROUP_STATE_COMPLETING_REBALANCE ||
                       state == RD_KAFKA_CONSUMER_GROUP_STATE_UNKNOWN;
    return rebalancing ? outcome::unsettled : outcome::settled;
  }

  void publish_if_changed(cluster_snapshot s) {
    if (have_published && s.group_state == last.group_state && same_members(s.members, last.members)) return;
    // Continue from whatever the registry holds so versions only grow, also across a
    // watcher restarted on the same registry.
    s.version = std::max(registry.current()->version, last.version) + 1;
    for (const auto& m : s.members) {
      if (m.endpoint.empty())
        log()->warn("group '{}' member {} (client id '{}') advertises no endpoint; its partitions cannot be routed",
                    kafka_cfg.application_id, m.member_id, m.client_id);
      log()->debug("group '{}' member {} at {}: {} partition(s)", kafka_cfg.application_id, m.member_id, m.endpoint,
                   m.partitions.size());
    }
    log()->info("group '{}' is {} with {} member(s) (membership version {})", kafka_cfg.application_id, s.group_state,
                s.members.size(), s.version);
    last = s;
    have_published = true;
    registry.publish(std::move(s));
  }

  // The thread's body: whatever escapes the loop (outside a refresh) is logged as
  // critical and the loop starts over after refresh_interval, so routing never freezes
  // on the last membership without a word.
  void run_guarded() {
    for (;;) {
      auto why = guarded([this] { run(); });
      if (!why) return;  // stopped
      ++failures;
      log()->critical("membership watcher: {}; routing keeps the last published membership, retrying in {} ms", *why,
                      cfg.refresh_interval.count());
      std::unique_lock lock(mu);
      if (cv.wait_for(lock, cfg.refresh_interval, [&] { return stop_req; })) return;
    }
  }

  void run() {
    using clock = std::chrono::steady_clock;
    auto next_due = clock::now();  // describe at once
    auto last_start = clock::now() - min_refresh_gap;
    while (true) {
      {
        std::unique_lock lock(mu);
        cv.wait_until(lock, next_due, [&] { return stop_req || wake; });
        if (stop_req) return;
        // A prompted refresh right after another waits out the gap (still stoppable).
        auto earliest = last_start + min_refresh_gap;
        if (wake && clock::now() < earliest) {
          cv.wait_until(lock, earliest, [&] { return stop_req; });
          if (stop_req) return;
        }
        wake = false;  // everything asked so far is covered by this refresh
      }
      rd_kafka_poll(rk, 0);  // serves the handle's error callback
      last_start = clock::now();
      // A refresh that throws (a bug, std::bad_alloc) is a failed refresh: logged,
      // counted, the previous membership kept, tried again at the usual interval.
      auto result = outcome::failed;
      if (auto why = guarded([&] { result = refresh(); })) note_failure("unexpected exception: " + *why);
      if (result == outcome::stopping) return;
      next_due = clock::now() + (result == outcome::unsettled ? std::min(cfg.unsettled_interval, cfg.refresh_interval)
                                                              : cfg.refresh_interval);
    }
  }
};

membership_watcher::membership_watcher(const ingest_config& kafka_cfg, membership_config cfg,
                                       membership_registry& registry)
    : impl_(std::make_unique<impl>(kafka_cfg, cfg, registry)) {}

membership_watcher::~membership_watcher() { stop(); }

status membership_watcher::start() {
  auto& i = *impl_;
  if (i.thread.joinable() || i.stopped) return status::invalid_argument("membership watcher already started");
  if (i.kafka_cfg.application_id.empty())
    return status::invalid_argument("membership watcher: application_id is empty");
  if (i.cfg.refresh_interval.count() <= 0 || i.cfg.unsettled_interval.count() <= 0 ||
      i.cfg.request_timeout.count() <= 0)
    return status::invalid_argument("membership watcher: intervals and timeout must be positive");
  if (auto s = i.create_handle(); !s.ok()) return s;
  i.thread = std::thread([&i] {
    name_this_thread("ks-membership");
    i.run_guarded();
  });
  return status::ok_status();
}

void membership_watcher::refresh_soon() {
  auto& i = *impl_;
  {
    std::lock_guard lock(i.mu);
    i.wake = true;
  }
  i.cv.notify_one();
}

void membership_watcher::stop() {
  auto& i = *impl_;
  if (i.stopped.exchange(true)) return;
  i.stopping = true;
  {
    std::lock_guard lock(i.mu);
    i.stop_req = true;
  }
  i.cv.notify_one();
  if (i.thread.joinable()) i.thread.join();
  if (i.rk) {
    rd_kafka_destroy(i.rk);
    i.rk = nullptr;
  }
}

uint64_t membership_watcher::failed_refreshes() const { return impl_->failures.load(); }

}  // namespace kstate::ingest
