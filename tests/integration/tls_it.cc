// TLS on the query API, checked with curl as the verifying client: a client trusting
// the CA gets answers; plain HTTP to the TLS port is closed and the server keeps
// serving; expired and wrong-host certificates are rejected; with mutual TLS a client
// without a certificate is rejected, and two instances forward to each other over TLS,
// each verifying the other's certificate and presenting its own. Certificates are made
// at test time by tests/integration/tls_certs.sh (openssl tool).
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "support.h"

using namespace kstate::testing;

namespace {

struct run_result {
  int rc = -1;
  std::string out;
};

// Runs a shell command, returning its exit code and standard output (stderr merged in
// when the command says 2>&1); never fails the test by itself.
run_result run(const std::string& cmd) {
  run_result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

struct curl_answer {
  int rc = -1;     // curl's exit code: 0, or 60 (certificate not verified), 35/56 (handshake/receive failed) ...
  int status = 0;  // HTTP status when rc == 0
  std::string body;
  std::string forwarded_to;  // X-Kstate-Forwarded-To
  std::string error;         // curl's message when rc != 0
};

// One request with curl. `opts` are extra curl options (--cacert, --cert, -H ...).
curl_answer curl(const std::string& opts, const std::string& url) {
  static int seq = 0;
  auto body_file = temp_dir("curl") + "/body" + std::to_string(++seq);
  auto r = run("curl -sS --max-time 20 -o '" + body_file + "' -w '%{http_code} %header{x-kstate-forwarded-to}' " +
               opts + " '" + url + "' 2>&1");
  curl_answer a;
  a.rc = r.rc;
  if (r.rc != 0) {
    a.error = r.out;
    return a;
  }
  auto sp = r.out.find(' ');
  a.status = std::stoi(r.out.substr(0, sp));
  if (sp != std::string::npos) a.forwarded_to = r.out.substr(sp + 1);
  std::ifstream in(body_file);
  a.body.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return a;
}

std::string url(const kstate_process& ks, const std::string& path, const std::string& host = "127.0.0.1") {
  return "https://" + host + ":" + std::to_string(ks.port()) + path;
}

// Waits until /readyz answers 200 over TLS (`opts` say how to trust the server).
void wait_ready_tls(kstate_process& ks, const std::string& opts) {
  for (int i = 0; i < 600; ++i) {
    auto a = curl(opts, url(ks, "/readyz"));
    if (a.rc == 0 && a.status == 200) return;
    REQUIRE_MESSAGE(::kill(ks.pid(), 0) == 0, "kstate exited; see " << ks.log_path());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  FAIL("not ready over TLS; see " << ks.log_path());
}

std::vector<std::string> tls_args(const std::string& dir, const std::string& cert, bool mutual = false) {
  std::vector<std::string> a{"--set", "http.tls.cert_file=" + dir + "/" + cert + ".crt", "--set",
                             "http.tls.key_file=" + dir + "/" + cert + ".key"};
  if (mutual) a.insert(a.end(), {"--set", "http.tls.client_ca_file=" + dir + "/ca.crt"});
  return a;
}

std::string make_certs() {
  auto dir = temp_dir("tls-certs");
  sh("cd '" + dir + "' && bash " KSTATE_SOURCE_DIR "/tests/integration/tls_certs.sh");
  return dir;
}

}  // namespace

TEST_CASE("TLS: a trusting client gets answers, plain HTTP is closed, expired and wrong-host certificates fail") {
  auto certs = make_certs();
  const std::string trust = "--cacert '" + certs + "/ca.crt'";
  auto topic = unique_name("tls");
  create_topic(topic, 2);
  produce(topic, {{"k1", R"({"v":1})"}, {"k2", R"({"v":2})"}});
  auto dir = temp_dir("tls");

  kstate_process good(unique_name("tls-app"), {{"s", topic}}, dir + "/good");
  good.extra_args(tls_args(certs, "server"));
  good.start();
  wait_ready_tls(good, trust);

  for (const std::string host : {"127.0.0.1", "localhost"}) {
    auto a = curl(trust, url(good, "/v1/stores/s/keys/k1", host));
    REQUIRE_MESSAGE(a.rc == 0, host << ": " << a.error);
    CHECK(a.status == 200);
    CHECK(json::parse(a.body)["value"] == json::parse(R"({"v":1})"));
    CHECK(json::parse(a.body)["served_by"].get<std::string>().rfind("https://127.0.0.1:", 0) == 0);
  }
  // Without the CA the client cannot verify the server.
  auto untrusted = curl("", url(good, "/livez"));
  CHECK(untrusted.rc == 60);

  // Plain HTTP to the TLS port: no answer, the connection is closed; then TLS still works.
  for (int i = 0; i < 3; ++i) {
    http_client plain(good.port());
    CHECK_FALSE(plain.get("/livez"));
    auto p = curl("", "http://127.0.0.1:" + std::to_string(good.port()) + "/livez");
    CHECK(p.rc != 0);
  }
  // TLS 1.1, and a TLS 1.2 suite without forward secrecy, are refused by the server
  // (the client offers them with its own security level lowered).
  const std::string s_client = "timeout 20 openssl s_client -connect 127.0.0.1:" + std::to_string(good.port()) +
                               " -CAfile '" + certs + "/ca.crt' </dev/null 2>&1";
  auto tls11 = run(s_client + " -tls1_1 -cipher 'DEFAULT@SECLEVEL=0'");
  CHECK(tls11.rc != 0);
  CHECK_MESSAGE(tls11.out.find("alert protocol version") != std::string::npos, tls11.out);
  auto weak = run(s_client + " -tls1_2 -cipher 'AES128-SHA256'");
  CHECK(weak.rc != 0);
  auto tls12 = run(s_client + " -tls1_2");
  CHECK_MESSAGE(tls12.rc == 0, tls12.out);
  CHECK(tls12.out.find("Verify return code: 0 (ok)") != std::string::npos);

  auto again = curl(trust, url(good, "/v1/stores/s/keys/k2"));
  REQUIRE_MESSAGE(again.rc == 0, again.error);
  CHECK(again.status == 200);
  CHECK(::kill(good.pid(), 0) == 0);
  CHECK(good.terminate() == 0);

  // A server with an expired certificate, and one whose certificate names another
  // host: a verifying client refuses both; without verification (-k) both answer, so it
  // is the certificate that fails, not the server.
  for (const std::string cert : {"expired", "wronghost"}) {
    CAPTURE(cert);
    kstate_process bad(unique_name("tls-app"), {{"s", topic}}, dir + "/" + cert);
    bad.extra_args(tls_args(certs, cert));
    bad.start();
    wait_ready_tls(bad, "-k");
    auto a = curl(trust, url(bad, "/v1/stores/s/keys/k1"));
    CHECK(a.rc == 60);
    if (cert == "expired") CHECK_MESSAGE(a.error.find("expired") != std::string::npos, a.error);
    else CHECK_MESSAGE(a.error.find("match") != std::string::npos, a.error);
    CHECK(bad.terminate() == 0);
  }
}

TEST_CASE("mutual TLS with tokens: no client certificate is refused; instances forward to each other over TLS") {
  auto certs = make_certs();
  auto topic = unique_name("mtls");
  const int partitions = 4;
  create_topic(topic, partitions);
  std::vector<produced> recs;
  table_model model;
  for (int i = 0; i < 200; ++i) {
    produced r{"k-" + std::to_string(i), R"({"n":)" + std::to_string(i) + "}"};
    recs.push_back(r);
    apply_record(model, r);
  }
  produce(topic, recs);

  auto dir = temp_dir("mtls");
  const std::string token = "tls-token-" + unique_name("t");
  auto hash = run("printf '%s' '" + token + "' | sha256sum").out.substr(0, 64);
  {
    std::ofstream f(dir + "/tokens.yaml");
    f << "tokens:\n  - {name: reader, sha256: " << hash << ", stores: [s], cluster: true}\n";
  }
  // Copies of any size: these partitions hold about 50 records each.
  const std::string extra = "auth: {token_file: " + dir + "/tokens.yaml}\npeer_bootstrap: {min_offsets: 1}\n";
  auto app = unique_name("mtls-app");
  kstate_process a(app, {{"s", topic}}, dir + "/a", extra);
  kstate_process b(app, {{"s", topic}}, dir + "/b", extra);
  a.extra_args(tls_args(certs, "server", true));
  b.extra_args(tls_args(certs, "server", true));
  const std::string client = "--cacert '" + certs + "/ca.crt' --cert '" + certs + "/client.crt' --key '" + certs +
                             "/client.key' -H 'Authorization: Bearer " + token + "'";
  // A alone first, holding every record; B then copies the partitions it takes over
  // from A over the same mutual-TLS channel as forwarding.
  a.start();
  wait_ready_tls(a, client);
  bool a_full = false;
  for (int i = 0; i < 300 && !a_full; ++i) {
    auto c = curl(client, url(a, "/v1/stores/s/count"));
    a_full = c.rc == 0 && c.status == 200 && json::parse(c.body)["count"] == model.size();
    if (!a_full) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE_MESSAGE(a_full, "A did not read the topic; see " << a.log_path());
  b.start();
  wait_ready_tls(b, client);

  // Without a client certificate the handshake fails, token or not.
  auto no_cert =
      curl("--cacert '" + certs + "/ca.crt' -H 'Authorization: Bearer " + token + "'", url(a, "/v1/stores/s/count"));
  CHECK(no_cert.rc != 0);
  // With it, but without a token: TLS is not authorization.
  auto no_token =
      curl("--cacert '" + certs + "/ca.crt' --cert '" + certs + "/client.crt' --key '" + certs + "/client.key'",
           url(a, "/v1/stores/s/count"));
  REQUIRE_MESSAGE(no_token.rc == 0, no_token.error);
  CHECK(no_token.status == 401);

  // Both instances in the group, each owning some partitions.
  bool settled = false;
  for (int i = 0; i < 300 && !settled; ++i) {
    auto c = curl(client, url(a, "/v1/cluster"));
    if (c.rc == 0 && c.status == 200) {
      auto j = json::parse(c.body);
      settled = j["group_state"] == "Stable" && j["instances"].size() == 2 &&
                j["partitions"].size() == static_cast<size_t>(partitions);
      for (const auto& inst : j["instances"]) settled = settled && inst["ready"] == true;
    }
    // And each instance holds its part itself: B takes its partitions only once their
    // copy is installed, while the group already names it their owner.
    size_t held = 0;
    for (auto* k : {&a, &b}) {
      auto rz = curl(client, url(*k, "/readyz"));
      const bool holds = rz.rc == 0 && rz.status == 200 && !json::parse(rz.body)["partitions"].empty();
      settled = settled && holds;
      if (holds) held += json::parse(rz.body)["partitions"].size();
    }
    settled = settled && held == static_cast<size_t>(partitions);
    if (!settled) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  REQUIRE_MESSAGE(settled, "the group did not settle; see " << a.log_path());

  // Every key through a: those b owns are forwarded over TLS (b's certificate verified
  // against the CA, a's presented as client certificate) and answered.
  size_t forwarded = 0;
  for (int i = 0; i < 200; i += 5) {
    auto key = "k-" + std::to_string(i);
    auto r = curl(client, url(a, "/v1/stores/s/keys/" + key));
    REQUIRE_MESSAGE(r.rc == 0, r.error);
    CHECK_MESSAGE(r.status == 200, key << ": " << r.body);
    if (r.status == 200) CHECK(json::parse(r.body)["value"] == json::parse(model.at(key)));
    if (!r.forwarded_to.empty()) {
      ++forwarded;
      CHECK(r.forwarded_to == "https://127.0.0.1:" + std::to_string(b.port()));
    }
  }
  MESSAGE(forwarded << " of 40 lookups forwarded over TLS");
  CHECK(forwarded > 0);
  // A count gathered from both owners.
  auto count = curl(client, url(a, "/v1/stores/s/count"));
  REQUIRE_MESSAGE(count.rc == 0, count.error);
  REQUIRE(count.status == 200);
  CHECK(json::parse(count.body)["count"] == model.size());

  // B's partitions were copied from A over TLS, and B answers every key as the model.
  {
    std::ifstream in(b.log_path());
    std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK_MESSAGE(log.find("installed a copy from https://127.0.0.1:" + std::to_string(a.port())) != std::string::npos,
                  "no copy over TLS; see " << b.log_path());
  }
  for (int i = 0; i < 200; i += 7) {
    auto key = "k-" + std::to_string(i);
    auto r = curl(client, url(b, "/v1/stores/s/keys/" + key));
    REQUIRE_MESSAGE(r.rc == 0, r.error);
    CHECK_MESSAGE(r.status == 200, key << ": " << r.body);
    if (r.status == 200) CHECK(json::parse(r.body)["value"] == json::parse(model.at(key)));
  }
  CHECK(a.terminate() == 0);
  CHECK(b.terminate() == 0);
}

TEST_CASE("an instance refuses to forward to a peer whose certificate its CA did not sign") {
  auto certs = make_certs();
  auto other = make_certs();  // another CA: the instances trust it for peers, not their own
  auto topic = unique_name("tls-peer");
  const int partitions = 4;
  create_topic(topic, partitions);
  std::vector<produced> recs;
  for (int i = 0; i < 40; ++i) recs.push_back({"k-" + std::to_string(i), R"({"n":1})"});
  produce(topic, recs);
  auto dir = temp_dir("tls-peer");
  auto app = unique_name("tls-peer-app");
  kstate_process a(app, {{"s", topic}}, dir + "/a");
  kstate_process b(app, {{"s", topic}}, dir + "/b");
  for (auto* ks : {&a, &b}) {
    auto args = tls_args(certs, "server");
    args.insert(args.end(), {"--set", "http.tls.peer_ca_file=" + other + "/ca.crt"});
    ks->extra_args(args);
    ks->start();
  }
  const std::string trust = "--cacert '" + certs + "/ca.crt'";
  wait_ready_tls(a, trust);
  wait_ready_tls(b, trust);
  bool settled = false;
  for (int i = 0; i < 300 && !settled; ++i) {
    auto c = curl(trust, url(a, "/v1/cluster?scope=local"));
    auto d = curl(trust, url(b, "/v1/cluster?scope=local"));
    if (c.rc == 0 && d.rc == 0 && c.status == 200 && d.status == 200) {
      auto ja = json::parse(c.body), jb = json::parse(d.body);
      settled = ja["partitions"].size() + jb["partitions"].size() == static_cast<size_t>(partitions) &&
                !ja["partitions"].empty() && !jb["partitions"].empty() &&
                curl(trust, url(a, "/readyz")).status == 200 && curl(trust, url(b, "/readyz")).status == 200;
      // a must also know from the group's description that b owns the rest (membership
      // refreshes follow a rebalance by up to a few seconds): only then is a lookup of
      // b's keys a forward, the one this test wants refused.
      if (settled) {
        auto g = curl(trust, url(a, "/v1/cluster"));
        settled = g.rc == 0 && g.status == 200;
        if (settled) {
          auto jg = json::parse(g.body);
          settled = jg["group_state"] == "Stable" && jg["instances"].size() == 2;
        }
      }
    }
    if (!settled) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  REQUIRE_MESSAGE(settled, "the partitions were not split between the instances; see " << a.log_path());
  // Keys a owns are answered; keys b owns would need a forward that fails verification.
  size_t refused = 0, answered = 0;
  for (int i = 0; i < 40; ++i) {
    auto r = curl(trust, url(a, "/v1/stores/s/keys/k-" + std::to_string(i)));
    REQUIRE_MESSAGE(r.rc == 0, r.error);
    if (r.status == 200) {
      ++answered;
      CHECK(r.forwarded_to.empty());
    } else {
      ++refused;
      CHECK(r.status == 503);
      CHECK_MESSAGE(r.body.find("certificate verify failed") != std::string::npos, r.body);
    }
  }
  MESSAGE(answered << " answered locally, " << refused << " refused: the owner's certificate was not trusted");
  CHECK(answered > 0);
  CHECK(refused > 0);
}
