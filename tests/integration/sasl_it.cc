// kstate against the test broker's SASL_PLAINTEXT listener (users created with Kafka's
// own storage tool, see scripts/kafka): the right SCRAM-SHA-512 or PLAIN password
// ingests and answers; a wrong one stops start-up at once with a clear error and a
// non-zero exit, even with a start-up timeout far longer than the test waits.
#include <doctest/doctest.h>

#include <fstream>

#include "support.h"

using namespace kstate::testing;

namespace {

std::string sasl_bootstrap() {
  auto out = kafka("bootstrap --sasl");
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::vector<std::string> sasl_args(const std::string& mechanism, const std::string& password) {
  return {"--bootstrap-servers",
          sasl_bootstrap(),
          "-X",
          "security.protocol=SASL_PLAINTEXT",
          "-X",
          "sasl.mechanisms=" + mechanism,
          "-X",
          "sasl.username=kstate",
          "-X",
          "sasl.password=" + password};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("the right SCRAM-SHA-512 and PLAIN passwords ingest and answer like the model") {
  auto topic = unique_name("sasl");
  create_topic(topic, 3);
  std::vector<produced> recs;
  table_model model;
  for (int i = 0; i < 300; ++i) {
    produced r{"k-" + std::to_string(i % 120), R"({"i":)" + std::to_string(i) + "}"};
    recs.push_back(r);
    apply_record(model, r);
  }
  produce(topic, recs);  // through the plaintext listener

  auto dir = temp_dir("sasl");
  for (const char* mechanism : {"SCRAM-SHA-512", "PLAIN"}) {
    CAPTURE(mechanism);
    kstate_process ks(unique_name("sasl-app"), {{"s", topic}}, dir + "/" + mechanism);
    ks.extra_args(sasl_args(mechanism, "kstate-secret"));
    ks.start();
    ks.wait_ready();
    http_client c(ks.port());
    for (const auto& [k, v] : model) {
      auto r = c.get("/v1/stores/s/keys/" + k);
      REQUIRE(r);
      REQUIRE_MESSAGE(r->status == 200, k << ": " << r->body);
      CHECK(r->body_json()["value"] == json::parse(v));
    }
    auto count = c.get("/v1/stores/s/count");
    REQUIRE(count);
    CHECK(count->body_json()["count"] == model.size());
    CHECK(ks.terminate() == 0);
  }
}

TEST_CASE("a wrong SASL password stops start-up at once with a clear error and exit code 1") {
  auto topic = unique_name("sasl-bad");
  create_topic(topic, 1);
  auto dir = temp_dir("sasl-bad");
  for (const char* mechanism : {"SCRAM-SHA-512", "PLAIN"}) {
    CAPTURE(mechanism);
    kstate_process ks(unique_name("sasl-bad-app"), {{"s", topic}}, dir + "/" + mechanism);
    auto args = sasl_args(mechanism, "not-the-password");
    // Ten minutes: were kstate retrying until the start-up timeout, it would still be
    // running when wait_exit gives up.
    args.insert(args.end(), {"--set", "ingest.startup_timeout_ms=600000"});
    ks.extra_args(args);
    ks.start();
    const int rc = ks.wait_exit(std::chrono::seconds(60));
    CHECK_MESSAGE(rc == 1, "exit status " << rc << "; see " << ks.log_path());
    auto log = read_file(ks.log_path());
    CHECK_MESSAGE(log.find("refused the credentials") != std::string::npos, log);
    CHECK(log.find("not-the-password") == std::string::npos);  // the password is never logged
  }
}
