// The in-process query API against the real broker: orders produced with the Java
// client, read back through kstate::embed::node and compared with a model of what was
// produced (the records themselves, and a recount by customer). Two nodes of one group
// check forwarding and not_here answers.

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "kstate/kstate.h"
#include "support.h"

using namespace kstate::embed;
namespace t = kstate::testing;

namespace {

constexpr int orders_count = 60;
constexpr int customers = 7;

std::string order_key(int i) { return "order-" + std::to_string(1000 + i); }
std::string customer_of(int i) { return "c" + std::to_string(i % customers); }
std::string order_value(int i, int amount) {
  // As the API renders JSON: compact, members sorted.
  return R"({"amount":)" + std::to_string(amount) + R"(,"customer":")" + customer_of(i) + R"("})";
}

node_options options(const std::string& app, const std::string& topic, const std::string& dir) {
  node_options o;
  o.application_id = app;
  o.bootstrap_servers = t::bootstrap();
  o.state_dir = dir;
  view_options orders;
  orders.name = "orders";
  orders.topic = topic;
  view_options by_customer;
  by_customer.name = "by_customer";
  by_customer.kind = view_kind::count;
  by_customer.topic = topic;
  by_customer.group_by = "json:customer";
  o.views = {orders, by_customer};
  o.settings = {{"ingest.max_batch_delay_ms", "5"}};
  return o;
}

template <typename F>
bool eventually(F f, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return f();
}

// Every page of a range, following the cursors.
std::vector<entry> all_pages(const node& n, const std::string& store, range_options r) {
  std::vector<entry> out;
  for (int pages = 0; pages < 1000; ++pages) {
    auto page = n.range(store, r);
    REQUIRE_MESSAGE(page.ok(), page.err().message);
    out.insert(out.end(), page->entries.begin(), page->entries.end());
    if (!page->next) break;
    r.cursor = *page->next;
  }
  return out;
}

}  // namespace

TEST_CASE("in-process queries and change listeners answer what was produced") {
  const auto topic = t::unique_name("embed-orders");
  const auto app = t::unique_name("embed-app");
  t::create_topic(topic, 3);

  // The model: what each key holds, where it was written.
  struct written {
    std::string value;
    int32_t partition;
    int64_t offset;
  };
  std::map<std::string, written> model;
  std::vector<t::produced> records;
  for (int i = 0; i < orders_count; ++i) records.push_back({order_key(i), order_value(i, 10 + i), std::nullopt});
  auto where = t::produce_bytes(topic, records);
  REQUIRE(where.size() == records.size());
  position produced;
  for (size_t i = 0; i < records.size(); ++i) {
    model[*records[i].key] = {*records[i].value, where[i].first, where[i].second};
    produced[where[i].first] = std::max(produced[where[i].first], where[i].second);
  }

  auto created = node::create(options(app, topic, t::temp_dir("embed-it")));
  REQUIRE_MESSAGE(created.ok(), created.err().message);
  node& n = **created;

  // Subscribed before start: every change the node applies is heard.
  std::mutex mu;
  std::vector<change> heard;
  std::vector<change> counted;
  auto sub = n.listen("orders", [&](const change& c) {
    std::lock_guard lock(mu);
    heard.push_back(c);
  });
  REQUIRE(sub.ok());
  // A one-change queue: ingest waits for this listener at every change.
  auto slow = n.listen(
      "by_customer",
      [&](const change& c) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        std::lock_guard lock(mu);
        counted.push_back(c);
      },
      listen_options{1});
  REQUIRE(slow.ok());

  auto started = n.start();
  REQUIRE_MESSAGE(started.ok(), started.err().message);
  CHECK(n.http_port() == 0);
  REQUIRE(eventually([&] { return n.ready(); }));

  SUBCASE("get, with min_position, answers each key's value, partition and offset") {
    for (const auto& [key, w] : model) {
      read_options o;
      o.min_position = {{w.partition, w.offset}};
      auto got = n.get("orders", key, o);
      REQUIRE_MESSAGE(got.ok(), got.err().message);
      CHECK(got->value == w.value);
      CHECK(got->partition == w.partition);
      CHECK(got->offset == w.offset);
      REQUIRE(got->pos.count(w.partition));
      CHECK(got->pos.at(w.partition) > w.offset);
    }
    auto absent = n.get("orders", "order-none");
    REQUIRE(absent.ok());
    CHECK_FALSE(absent->value);
    CHECK(absent->partition >= 0);
    CHECK(absent->pos.count(absent->partition));
    auto nostore = n.get("nope", "k");
    CHECK(nostore.err().code == error_code::not_found);
  }

  SUBCASE("a min_position beyond what exists times out, as over HTTP") {
    read_options o;
    o.min_position = {{0, produced[0] + 1000}};
    o.timeout = std::chrono::milliseconds(300);
    auto got = n.get("orders", order_key(0), o);
    // Only the key's own partition is waited for.
    if (model[order_key(0)].partition == 0) {
      REQUIRE_FALSE(got.ok());
      CHECK(got.err().code == error_code::deadline_exceeded);
    }
    auto c = n.count("orders", o);
    REQUIRE_FALSE(c.ok());
    CHECK(c.err().code == error_code::deadline_exceeded);
  }

  SUBCASE("get_many keeps the request order and says which keys are absent") {
    read_options o;
    o.min_position = produced;
    std::vector<std::string> keys{order_key(5), "missing-1", order_key(0), order_key(42)};
    auto got = n.get_many("orders", keys, o);
    REQUIRE_MESSAGE(got.ok(), got.err().message);
    REQUIRE(got->keys.size() == keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = model.find(keys[i]);
      if (it == model.end()) {
        CHECK_FALSE(got->keys[i].value);
      } else {
        CHECK(got->keys[i].value == it->second.value);
        CHECK(got->keys[i].offset == it->second.offset);
        CHECK(got->keys[i].partition == it->second.partition);
      }
    }
  }

  SUBCASE("ranges come in key order across partitions, page by page") {
    range_options r;
    r.limit = 7;
    auto all = all_pages(n, "orders", r);
    REQUIRE(all.size() == model.size());
    auto it = model.begin();
    for (const auto& e : all) {
      CHECK(e.key == it->first);
      CHECK(e.value == it->second.value);
      CHECK(e.offset == it->second.offset);
      ++it;
    }
    range_options prefix;
    prefix.prefix = "order-101";
    prefix.descending = true;
    auto some = all_pages(n, "orders", prefix);
    std::vector<std::string> want;
    for (const auto& [k, w] : model)
      if (k.rfind("order-101", 0) == 0) want.push_back(k);
    std::reverse(want.begin(), want.end());
    REQUIRE(some.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) CHECK(some[i].key == want[i]);
    range_options bounded;
    bounded.from = order_key(10);
    bounded.to = order_key(20);
    CHECK(all_pages(n, "orders", bounded).size() == 10);
    range_options bad;
    bad.cursor = "not-a-cursor";
    CHECK(n.range("orders", bad).err().code == error_code::invalid_argument);
  }

  SUBCASE("count and the count view agree with a recount of the orders") {
    auto c = n.count("orders");
    REQUIRE(c.ok());
    CHECK(c->count == orders_count);
    CHECK(c->exact);
    std::map<std::string, int> recount;
    for (int i = 0; i < orders_count; ++i) ++recount[customer_of(i)];
    std::map<std::string, int> seen;
    REQUIRE(eventually([&] {
      seen.clear();
      int total = 0;
      for (const auto& e : all_pages(n, "by_customer", {})) total += (seen[e.key] = std::stoi(e.value));
      return total == orders_count;
    }));
    CHECK(seen == recount);
    // The slow listener with its one-change queue still heard every count, in order.
    REQUIRE(eventually([&] {
      std::lock_guard lock(mu);
      std::map<std::string, int> last;
      for (const auto& c : counted) last[c.key] = std::stoi(*c.new_value);
      return last == recount;
    }));
  }

  SUBCASE("a change stream gives every order once in each partition's order, and resumes from any event") {
    // What the topic holds, per partition in offset order.
    std::map<int32_t, std::vector<std::pair<int64_t, std::string>>> want;
    for (size_t i = 0; i < records.size(); ++i) want[where[i].first].push_back({where[i].second, *records[i].key});
    position beginning;
    for (const auto& [p, recs] : want) beginning[p] = 0;
    auto read_all = [&](change_stream& s) {
      std::vector<feed_event> out;
      REQUIRE(eventually([&] {
        auto got = s.next(std::chrono::milliseconds(200));
        REQUIRE_MESSAGE(got.ok(), got.err().message);
        out.insert(out.end(), got->begin(), got->end());
        return out.size() >= records.size();
      }));
      return out;
    };
    auto stream = n.changes("orders", {.from_position = beginning});
    REQUIRE_MESSAGE(stream.ok(), stream.err().message);
    auto events = read_all(*stream);
    REQUIRE(events.size() == records.size());
    std::map<int32_t, std::vector<std::pair<int64_t, std::string>>> got;
    for (const auto& e : events) {
      got[e.partition].push_back({e.offset, e.key});
      CHECK(e.value == model[e.key].value);
      CHECK(e.pos.at(e.partition) == e.offset + 1);
    }
    CHECK(got == want);
    // From the position of the 20th event: exactly the events after it.
    auto resumed = n.changes("orders", {.from_position = events[19].pos});
    REQUIRE(resumed.ok());
    std::vector<feed_event> rest;
    REQUIRE(eventually([&] {
      auto more = resumed->next(std::chrono::milliseconds(200));
      REQUIRE(more.ok());
      rest.insert(rest.end(), more->begin(), more->end());
      return rest.size() >= records.size() - 20;
    }));
    std::multiset<std::pair<int32_t, int64_t>> after, expected;
    for (const auto& e : rest) after.insert({e.partition, e.offset});
    for (size_t i = 20; i < events.size(); ++i) expected.insert({events[i].partition, events[i].offset});
    CHECK(after == expected);
    // One key, and the refusals.
    auto one = n.changes("orders", {.keys = {order_key(7)}, .from_position = beginning});
    REQUIRE(one.ok());
    auto seven = one->next(std::chrono::seconds(5));
    REQUIRE(seven.ok());
    REQUIRE(seven->size() == 1);
    CHECK((*seven)[0].key == order_key(7));
    // An aggregate's stream reads its changelog: from its beginning, the last update of
    // each customer is the recount.
    std::map<std::string, int> recount;
    for (int i = 0; i < orders_count; ++i) ++recount[customer_of(i)];
    position changelog_start;
    auto by_customer_pos = n.current_position("by_customer");
    REQUIRE(by_customer_pos.ok());
    for (const auto& [p, next] : *by_customer_pos) changelog_start[p] = 0;
    auto counts = n.changes("by_customer", {.from_position = changelog_start});
    REQUIRE_MESSAGE(counts.ok(), counts.err().message);
    std::map<std::string, int> last;
    REQUIRE(eventually([&] {
      auto more = counts->next(std::chrono::milliseconds(200));
      REQUIRE(more.ok());
      for (const auto& e : *more) {
        CHECK(e.source_offset >= 0);
        REQUIRE(e.value);
        last[e.key] = std::stoi(*e.value);
      }
      return last == recount;
    }));
    CHECK(n.changes("orders", {.from_position = {{0, 0}}}).err().code == error_code::invalid_argument);
    CHECK(n.changes("nope").err().code == error_code::not_found);
  }

  SUBCASE("listeners hear every applied change with its old value and position") {
    REQUIRE(eventually([&] {
      std::lock_guard lock(mu);
      return heard.size() >= model.size();
    }));
    {
      std::lock_guard lock(mu);
      CHECK(heard.size() == model.size());
      for (const auto& c : heard) {
        auto it = model.find(c.key);
        REQUIRE(it != model.end());
        CHECK(c.store == "orders");
        CHECK_FALSE(c.old_value);
        // The stored bytes, as the producer wrote them.
        CHECK(c.new_value == it->second.value);
        CHECK(c.offset == it->second.offset);
        CHECK(c.partition == it->second.partition);
        CHECK(c.next_offset > c.offset);
      }
    }
    // An update and a delete of one key, seen as such.
    const auto key = order_key(3);
    t::interactive_producer p(topic);
    auto upd = p.send({key, order_value(3, 999), std::nullopt});
    auto del = p.send({key, std::nullopt, std::nullopt});
    REQUIRE(upd.first == model[key].partition);
    read_options o;
    o.min_position = {{del.first, del.second}};
    auto got = n.get("orders", key, o);
    REQUIRE_MESSAGE(got.ok(), got.err().message);
    CHECK_FALSE(got->value);
    // Delivered after the write, on the listener's thread: wait for the delete's change.
    REQUIRE(eventually([&] {
      std::lock_guard lock(mu);
      return !heard.empty() && heard.back().key == key && heard.back().next_offset > del.second;
    }));
    std::lock_guard lock(mu);
    std::vector<change> mine;
    for (size_t i = model.size(); i < heard.size(); ++i) mine.push_back(heard[i]);
    // Both records may land in one batch: then only the delete, from the first value.
    REQUIRE(!mine.empty());
    CHECK(mine.back().key == key);
    CHECK_FALSE(mine.back().new_value);
    CHECK(mine.back().next_offset == del.second + 1);
    if (mine.size() == 2) {
      CHECK(mine[0].old_value == model[key].value);
      CHECK(mine[0].new_value == order_value(3, 999));
      CHECK(mine[0].offset == upd.second);
      CHECK(mine[1].old_value == order_value(3, 999));
    } else {
      CHECK(mine[0].old_value == model[key].value);
    }
  }

  n.stop();
  CHECK(n.get("orders", order_key(1)).err().code == error_code::unavailable);
  CHECK(sub->delivered() >= model.size());
}

TEST_CASE("windowed views: a key's windows and pages of windows across keys equal a recount") {
  const auto topic = t::unique_name("embed-clicks");
  t::create_topic(topic, 3);
  // Clicks of 5 users, 37 s apart from three hours ago on: 10-minute windows.
  constexpr int64_t size_ms = 600'000;
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  const int64_t base = (now_ms - 3 * 3'600'000) / 3'600'000 * 3'600'000;
  std::vector<t::produced> clicks;
  std::map<std::pair<std::string, int64_t>, int> recount;  // (user, window start) -> clicks
  for (int i = 0; i < 200; ++i) {
    const auto user = "u" + std::to_string(i % 5);
    const int64_t ts = base + i * 37'000;
    clicks.push_back({user, R"({"n":)" + std::to_string(i) + "}", ts});
    ++recount[{user, ts / size_ms * size_ms}];
  }
  t::produce_bytes(topic, clicks);

  node_options o;
  o.application_id = t::unique_name("embed-windows");
  o.bootstrap_servers = t::bootstrap();
  o.state_dir = t::temp_dir("embed-windows");
  view_options per_user;
  per_user.name = "clicks";
  per_user.kind = view_kind::count;
  per_user.topic = topic;
  per_user.window = window_options{.size = "10m"};
  o.views = {per_user};
  auto created = node::create(o);
  REQUIRE_MESSAGE(created.ok(), created.err().message);
  node& n = **created;
  REQUIRE(n.start().ok());
  const int64_t from = base, to = base + 4 * 3'600'000;

  // Every window of every user, as a recount would have them, in (user, start) order.
  std::vector<std::tuple<std::string, int64_t, int64_t, std::string>> want;
  for (const auto& [k, c] : recount) want.emplace_back(k.first, k.second, k.second + size_ms, std::to_string(c));
  std::vector<std::tuple<std::string, int64_t, int64_t, std::string>> got;
  REQUIRE(eventually([&] {
    got.clear();
    windows_range_options r{.from = from, .to = to, .limit = 7};
    for (int pages = 0; pages < 1000; ++pages) {
      auto page = n.windows_range("clicks", r);
      if (!page.ok()) return false;
      for (const auto& e : page->entries) got.emplace_back(e.key, e.window.start, e.window.end, e.window.value);
      if (!page->next) break;
      r.cursor = *page->next;
    }
    return got == want;
  }));
  CHECK(got == want);

  // One user's windows, and a key range of two users.
  auto one = n.windows("clicks", "u3", from, to);
  REQUIRE_MESSAGE(one.ok(), one.err().message);
  std::vector<std::tuple<std::string, int64_t, int64_t, std::string>> u3, want_u3, u1_u2, want_u1_u2;
  for (const auto& w : one->windows) u3.emplace_back("u3", w.start, w.end, w.value);
  for (const auto& w : want) {
    if (std::get<0>(w) == "u3") want_u3.push_back(w);
    if (std::get<0>(w) == "u1" || std::get<0>(w) == "u2") want_u1_u2.push_back(w);
  }
  CHECK(u3 == want_u3);
  auto page = n.windows_range("clicks", {.key_from = "u1", .key_to = "u3", .from = from, .to = to, .limit = 1000});
  REQUIRE_MESSAGE(page.ok(), page.err().message);
  for (const auto& e : page->entries) u1_u2.emplace_back(e.key, e.window.start, e.window.end, e.window.value);
  CHECK(u1_u2 == want_u1_u2);
  CHECK_FALSE(page->next);
  CHECK(n.windows_range("clicks", {.from = from, .to = to}, {.min_position = {{0, 1}}}).err().code ==
        error_code::invalid_argument);
  CHECK(n.windows_range("orders", {.from = from, .to = to}).err().code == error_code::not_found);
  n.stop();
}

TEST_CASE("two nodes of one group: forwarding to the owner, or not_here naming it") {
  const auto topic = t::unique_name("embed-pair");
  const auto app = t::unique_name("embed-pair-app");
  t::create_topic(topic, 4);
  std::vector<t::produced> records;
  for (int i = 0; i < 40; ++i) records.push_back({order_key(i), order_value(i, i), std::nullopt});
  auto where = t::produce_bytes(topic, records);
  const auto secret_dir = t::temp_dir("embed-secret");
  const auto secret = secret_dir + "/secret";
  std::ofstream(secret) << "embed-pair-shared-secret-0123456789\n";

  auto make = [&](const std::string& name) {
    auto o = options(app, topic, t::temp_dir(name));
    // The table alone: with the count view's repartition topic the assignor may give
    // one node every partition of the source topic, and the other the repartition's.
    o.views.resize(1);
    o.serve_http = true;
    o.listen = "127.0.0.1:0";
    o.settings.push_back({"peer_secret_file", secret});
    auto n = node::create(o);
    REQUIRE_MESSAGE(n.ok(), n.err().message);
    auto s = (*n)->start();
    REQUIRE_MESSAGE(s.ok(), s.err().message);
    return std::move(n.value());
  };
  auto a = make("embed-a");
  auto b = make("embed-b");
  CHECK(a->http_port() != 0);
  CHECK(a->endpoint() != b->endpoint());

  // Settled: each owns some partitions and every key is answered, by either node.
  std::string last_failure;
  auto everywhere = [&] {
    std::set<std::string> servers;
    for (size_t i = 0; i < records.size(); ++i)
      for (node* n : {a.get(), b.get()}) {
        auto got = n->get("orders", *records[i].key);
        if (!got.ok() || got->value != records[i].value) {
          last_failure = got.ok() ? "a wrong value" : got.err().message;
          return false;
        }
        servers.insert(got->served_by);
      }
    last_failure = "answered by " + std::to_string(servers.size()) + " node(s)";
    return servers.size() == 2;
  };
  REQUIRE_MESSAGE(eventually(everywhere, std::chrono::seconds(90)), last_failure);

  int forwarded = 0, refused = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    auto got = a->get("orders", *records[i].key);
    REQUIRE(got.ok());
    CHECK(got->value == records[i].value);
    CHECK(got->partition == where[i].first);
    CHECK(got->offset == where[i].second);
    read_options here_only;
    here_only.route = routing::not_here;
    auto local = a->get("orders", *records[i].key, here_only);
    if (got->served_by == b->endpoint()) {
      ++forwarded;
      REQUIRE_FALSE(local.ok());
      CHECK(local.err().code == error_code::not_here);
      CHECK(local.err().owner == b->endpoint());
      ++refused;
    } else {
      CHECK(got->served_by == a->endpoint());
      REQUIRE(local.ok());
      CHECK(local->value == records[i].value);
    }
  }
  CHECK(forwarded > 0);
  CHECK(refused == forwarded);
  // A count gathers both nodes' parts; with not_here it refuses, naming an owner.
  auto c = a->count("orders");
  REQUIRE(c.ok());
  CHECK(c->count == records.size());
  read_options here_only;
  here_only.route = routing::not_here;
  auto partial = a->count("orders", here_only);
  REQUIRE_FALSE(partial.ok());
  CHECK(partial.err().owner == b->endpoint());
  std::vector<std::string> keys;
  for (const auto& r : records) keys.push_back(*r.key);
  auto many = b->get_many("orders", keys);
  REQUIRE_MESSAGE(many.ok(), many.err().message);
  for (size_t i = 0; i < keys.size(); ++i) CHECK(many->keys[i].value == records[i].value);
  b->stop();
  a->stop();
}
