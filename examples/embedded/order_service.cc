// order_service: a small application that embeds kstate. It materializes an `orders`
// topic (key: order id, value: {"customer": "...", "amount": n}) into a table and a
// count of orders per customer, answers a tiny line protocol on standard input from
// them, and prints every change of the count as it is applied.
//
//   order_service BOOTSTRAP TOPIC APPLICATION_ID STATE_DIR
//
// Commands, one per line; each answer is one line starting with the command's name:
//   order <id>        -> "order <id> <value> partition=<p> offset=<o>" or "order <id> none"
//   customer <name>   -> "customer <name> <count>" (0 when the customer has none)
//   customers         -> "customers <name>=<count> ..." (every customer, in name order)
//   orders            -> "orders <number of orders>"
//   quit
// Changes are printed as "change <customer> <old count> -> <new count>".

#include <kstate/kstate.h>

#include <iostream>
#include <mutex>
#include <sstream>
#include <string>

namespace ks = kstate::embed;

namespace {

std::mutex out_mu;  // one line at a time: answers and changes share standard output

void say(const std::string& line) {
  std::lock_guard lock(out_mu);
  std::cout << line << std::endl;
}

std::string answer(const ks::node& n, const std::string& line) {
  std::istringstream in(line);
  std::string cmd, arg;
  in >> cmd >> arg;
  if (cmd == "order") {
    auto r = n.get("orders", arg);
    if (!r.ok()) return "error " + r.err().message;
    if (!r->value) return "order " + arg + " none";
    return "order " + arg + " " + *r->value + " partition=" + std::to_string(r->partition) +
           " offset=" + std::to_string(r->offset);
  }
  if (cmd == "customer") {
    auto r = n.get("orders_per_customer", arg);
    if (!r.ok()) return "error " + r.err().message;
    return "customer " + arg + " " + r->value.value_or("0");
  }
  if (cmd == "customers") {
    std::string text = "customers";
    ks::range_options page;
    for (;;) {
      auto r = n.range("orders_per_customer", page);
      if (!r.ok()) return "error " + r.err().message;
      for (const auto& e : r->entries) text += " " + e.key + "=" + e.value;
      if (!r->next) return text;
      page.cursor = *r->next;
    }
  }
  if (cmd == "orders") {
    auto r = n.count("orders");
    if (!r.ok()) return "error " + r.err().message;
    return "orders " + std::to_string(r->count);
  }
  return "error unknown command '" + cmd + "'";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: order_service BOOTSTRAP TOPIC APPLICATION_ID STATE_DIR\n";
    return 2;
  }
  ks::node_options o;
  o.bootstrap_servers = argv[1];
  o.application_id = argv[3];
  o.state_dir = argv[4];
  ks::view_options orders;
  orders.name = "orders";
  orders.topic = argv[2];
  ks::view_options per_customer;
  per_customer.name = "orders_per_customer";
  per_customer.kind = ks::view_kind::count;
  per_customer.topic = argv[2];
  per_customer.group_by = "json:customer";
  o.views = {orders, per_customer};

  auto created = ks::node::create(o);
  if (!created.ok()) {
    std::cerr << "order_service: " << created.err().message << "\n";
    return 2;
  }
  ks::node& n = **created;
  auto changes = n.listen("orders_per_customer", [](const ks::change& c) {
    say("change " + c.key + " " + c.old_value.value_or("0") + " -> " + c.new_value.value_or("0"));
  });
  if (!changes.ok()) {
    std::cerr << "order_service: " << changes.err().message << "\n";
    return 1;
  }
  if (auto s = n.start(); !s.ok()) {
    std::cerr << "order_service: " << s.err().message << "\n";
    return 1;
  }
  say("ready kstate " + std::string(ks::version()));
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") say(answer(n, line));
  n.stop();
  return 0;
}
