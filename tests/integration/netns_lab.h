#pragma once
// Hosts for the network-partition scenarios (partition_it): each host is a Linux network
// namespace joined by a veth pair to one bridge in the test's own namespace, which has
// an address on the bridge too and so reaches every host directly. Faults are applied
// on the bridge side of each veth pair (the root namespace), so a host never sees them
// as local errors: what it sends is dropped or delayed on the way, as on a real network.
//
// Only iproute2 (`ip`, `tc`) is used, with what the kernel offers without modules: an
// htb qdisc on every bridge-side veth with three classes: pass, drop (a pfifo that holds
// nothing) and slow (1 Mbit/s with a 30-packet queue: up to about 360 ms of queueing
// delay for full-size packets, jitter as it fills and drains, losses when it overflows),
// and u32 filters that send chosen packets to drop or slow. netem is not
// needed (the CI's kernel has none).
//
// Needs root. Not thread-safe: the test thread drives it.

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support.h"

namespace kstate::testing {

class netns_lab {
 public:
  struct host {
    std::string name;     // "broker", "a", ...
    std::string netns;    // prefix + name
    std::string veth;     // bridge side of the pair (root namespace)
    std::string address;  // IPv4 address inside the namespace
  };

  // Every name in these ranges is this lab's: leftovers of a run that died are removed
  // by name.
  static constexpr const char* netns_prefix = "kstate-part-";
  static constexpr const char* veth_prefix = "kpart-";
  static constexpr const char* bridge = "kpartbr0";
  static constexpr const char* subnet = "10.213.77.";  // .254: the bridge (the test itself)

  // Hosts named `names`, at .1, .2, ... in that order.
  explicit netns_lab(const std::vector<std::string>& names) {
    clean_leftovers();
    run("ip link add " + std::string(bridge) + " type bridge");
    run("ip addr add " + std::string(subnet) + "254/24 dev " + bridge);
    run("ip link set " + std::string(bridge) + " up");
    int n = 1;
    for (const auto& name : names) {
      host h{name, netns_prefix + name, veth_prefix + name, subnet + std::to_string(n++)};
      const std::string inner = "kpi-" + name;
      run("ip netns add " + h.netns);
      run("ip link add " + h.veth + " type veth peer name " + inner);
      run("ip link set " + inner + " netns " + h.netns);
      in(h, "ip link set lo up");
      in(h, "ip addr add " + h.address + "/24 dev " + inner);
      in(h, "ip link set " + inner + " up");
      run("ip link set " + h.veth + " master " + bridge);
      run("ip link set " + h.veth + " up");
      // 1:10 passes (the default), 1:20 drops everything, 1:30 is a slow link.
      run("tc qdisc add dev " + h.veth + " root handle 1: htb default 10");
      run("tc class add dev " + h.veth + " parent 1: classid 1:10 htb rate 10gbit quantum 60000");
      run("tc class add dev " + h.veth + " parent 1: classid 1:20 htb rate 10gbit quantum 60000");
      run("tc qdisc add dev " + h.veth + " parent 1:20 handle 20: pfifo limit 0");
      run("tc class add dev " + h.veth + " parent 1: classid 1:30 htb rate 1mbit ceil 1mbit quantum 1514");
      run("tc qdisc add dev " + h.veth + " parent 1:30 handle 30: pfifo limit 30");
      hosts_.emplace(name, h);
    }
  }
  ~netns_lab() { clean_leftovers(); }
  netns_lab(const netns_lab&) = delete;
  netns_lab& operator=(const netns_lab&) = delete;

  const host& at(const std::string& name) const { return hosts_.at(name); }

  // Removes every namespace, veth and bridge of this lab (from this run or an earlier
  // one that died), killing the processes still in its namespaces.
  static void clean_leftovers() {
    (void)std::system(("for ns in $(ip netns list | awk '{print $1}' | grep '^" + std::string(netns_prefix) +
                       "'); do pids=$(ip netns pids \"$ns\"); [ -n \"$pids\" ] && kill -9 $pids; "
                       "ip netns del \"$ns\"; done 2>/dev/null; "
                       "for l in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^" +
                       std::string(veth_prefix) + "'); do ip link del \"$l\"; done 2>/dev/null; " + "ip link del " +
                       bridge + " 2>/dev/null; true")
                          .c_str());
  }

  // Packets between `a` and `b` silently dropped, both ways: connections hang until
  // their own timeouts, as behind a dead switch or a firewall that drops.
  void cut(const std::string& a, const std::string& b) {
    drop_from(at(a), at(b).address);
    drop_from(at(b), at(a).address);
  }

  // A degraded link for `name`, in and out: 1 packet in 32 lost (by IP id, so TCP's
  // retransmission, which has another id, gets through), odd IP ids through the slow
  // class (delay and jitter from its queue, losses when it overflows, and reordering
  // against the even ones, which pass at once).
  void degrade(const std::string& name) {
    const auto& h = at(name);
    // Into the host: everything on its veth. IP id is the 16 bits at offset 4.
    filter(h.veth, "match u16 0x0011 0x001f at 4", "1:20");
    filter(h.veth, "match u16 0x0001 0x0001 at 4", "1:30");
    // Out of it: on every other host's veth.
    for (const auto& [other, o] : hosts_) {
      if (other == name) continue;
      filter(o.veth, "match ip src " + h.address + "/32 match u16 0x0011 0x001f at 4", "1:20");
      filter(o.veth, "match ip src " + h.address + "/32 match u16 0x0001 0x0001 at 4", "1:30");
    }
  }

  // The host's cable pulled (down) or plugged in again (up).
  void link(const std::string& name, bool up) { run("ip link set " + at(name).veth + (up ? " up" : " down")); }

  // Every cut and degradation removed, every link up.
  void heal() {
    for (const auto& [name, h] : hosts_) {
      (void)std::system(("tc filter del dev " + h.veth + " parent 1: 2>/dev/null").c_str());
      run("ip link set " + h.veth + " up");
    }
  }

  // Packets on their way into the host that the drop class discarded, and that the slow
  // class sent on, so far: the faults did act.
  int64_t dropped(const std::string& name) const { return qdisc_stat(name, "20:", "dropped "); }
  int64_t slowed(const std::string& name) const { return qdisc_stat(name, "30:", " bytes "); }

 private:
  static void run(const std::string& cmd) { sh(cmd + " 2>&1"); }
  // The number after `label` in the statistics of the host's qdisc `handle`, e.g.
  // " Sent 650 bytes 7 pkt (dropped 3, ...": " bytes " gives 7, "dropped " 3.
  int64_t qdisc_stat(const std::string& name, const std::string& handle, const std::string& label) const {
    auto out = sh("tc -s qdisc show dev " + at(name).veth);
    auto q = out.find("qdisc pfifo " + handle);
    auto p = q == std::string::npos ? q : out.find(label, q);
    return p == std::string::npos ? 0 : std::stoll(out.substr(p + label.size()));
  }
  static void in(const host& h, const std::string& cmd) { run("ip netns exec " + h.netns + " " + cmd); }
  void drop_from(const host& into, const std::string& source) {
    filter(into.veth, "match ip src " + source + "/32", "1:20");
  }
  void filter(const std::string& dev, const std::string& match, const std::string& flow) {
    run("tc filter add dev " + dev + " parent 1: protocol ip prio " + std::to_string(++prio_) + " u32 " + match +
        " flowid " + flow);
  }
  std::map<std::string, host> hosts_;
  int prio_ = 0;
};

// Undoes every fault of the lab when a case ends, whether its checks passed or not.
struct healed_on_exit {
  netns_lab& lab;
  ~healed_on_exit() {
    try {
      lab.heal();
    } catch (...) {  // a failed `tc` must not end the process from a destructor
    }
  }
};

}  // namespace kstate::testing
