// The framing of batched forwarded requests (server/src/api/forward_batch.h): what is
// encoded decodes to the same requests and answers, the bytes follow the documented
// layout, and truncated, padded, oversized or random bodies are refused, never
// misread.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "api/forward_batch.h"

using namespace kstate::server::api;

namespace {

std::string random_bytes(std::mt19937& rng, std::size_t max) {
  std::uniform_int_distribution<std::size_t> len(0, max);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string s(len(rng), '\0');
  for (auto& c : s) c = static_cast<char>(byte(rng));
  return s;
}

forward_sub_request random_request(std::mt19937& rng) {
  forward_sub_request r;
  r.target = "/" + random_bytes(rng, 300);
  if (rng() % 2) r.accept = random_bytes(rng, 40);
  if (rng() % 2) r.content_type = random_bytes(rng, 40);
  r.request_id = random_bytes(rng, 40);
  return r;
}

forward_sub_response random_response(std::mt19937& rng) {
  forward_sub_response r;
  r.status = rng() % 5 == 0 ? 0 : 100 + static_cast<unsigned>(rng() % 500);
  r.content_type = random_bytes(rng, 40);
  const std::size_t headers = rng() % 4;
  for (std::size_t i = 0; i < headers; ++i) r.headers.emplace_back("h" + random_bytes(rng, 20), random_bytes(rng, 60));
  r.body = random_bytes(rng, rng() % 10 == 0 ? 70'000 : 500);
  return r;
}

// Big-endian helpers written out here, so the layout is checked against the
// documentation rather than against the encoder.
std::string be(uint32_t v, int bytes) {
  std::string s;
  for (int shift = 8 * (bytes - 1); shift >= 0; shift -= 8) s.push_back(static_cast<char>((v >> shift) & 0xff));
  return s;
}
std::string str(const std::string& s) { return be(static_cast<uint32_t>(s.size()), 4) + s; }

}  // namespace

TEST_CASE("forward batch: random requests and answers come back exactly as encoded") {
  std::mt19937 rng(20261207);
  for (int round = 0; round < 300; ++round) {
    std::vector<forward_sub_request> requests(1 + rng() % 70);
    for (auto& r : requests) r = random_request(rng);
    auto decoded = decode_forward_requests(encode_forward_requests(requests));
    REQUIRE_MESSAGE(decoded.ok(), decoded.error().message());
    CHECK(*decoded == requests);

    std::vector<forward_sub_response> responses(rng() % 70);
    for (auto& r : responses) r = random_response(rng);
    auto answers = decode_forward_responses(encode_forward_responses(responses));
    REQUIRE_MESSAGE(answers.ok(), answers.error().message());
    CHECK(*answers == responses);
  }
}

TEST_CASE("forward batch: the bytes follow the documented layout") {
  // One request with an Accept header and no Content-Type.
  const std::string request = std::string("KSF1") + be(1, 2) + be(1, 1) +
                              str("/v1/stores/s/keys/a%2Fb?key_format=string") + str("application/json") + str("") +
                              str("req-7");
  auto r = decode_forward_requests(request);
  REQUIRE_MESSAGE(r.ok(), r.error().message());
  REQUIRE(r->size() == 1);
  CHECK((*r)[0].target == "/v1/stores/s/keys/a%2Fb?key_format=string");
  CHECK((*r)[0].accept == std::optional<std::string>("application/json"));
  CHECK(!(*r)[0].content_type);
  CHECK((*r)[0].request_id == "req-7");
  CHECK(encode_forward_requests(*r) == request);

  // Two answers: a 404 with one header, and one not carried (status 0).
  const std::string response = std::string("KSF1") + be(2, 2) + be(404, 2) + str("application/problem+json") +
                               be(1, 2) + str("X-Kstate-Position") + str("0:5") + str("{\"x\":1}") + be(0, 2) +
                               str("") + be(0, 2) + str("");
  auto a = decode_forward_responses(response);
  REQUIRE_MESSAGE(a.ok(), a.error().message());
  REQUIRE(a->size() == 2);
  CHECK((*a)[0].status == 404);
  CHECK((*a)[0].content_type == "application/problem+json");
  CHECK((*a)[0].headers == std::vector<std::pair<std::string, std::string>>{{"X-Kstate-Position", "0:5"}});
  CHECK((*a)[0].body == "{\"x\":1}");
  CHECK((*a)[1].status == 0);
  CHECK(encode_forward_responses(*a) == response);
}

TEST_CASE("forward batch: every truncation, any trailing byte and random bodies are refused") {
  std::mt19937 rng(7);
  std::vector<forward_sub_request> requests(5);
  for (auto& r : requests) r = random_request(rng);
  const auto req = encode_forward_requests(requests);
  for (std::size_t n = 0; n < req.size(); ++n) CHECK_FALSE(decode_forward_requests(req.substr(0, n)).ok());
  CHECK_FALSE(decode_forward_requests(req + '\0').ok());

  std::vector<forward_sub_response> responses(5);
  for (auto& r : responses) r = random_response(rng);
  const auto resp = encode_forward_responses(responses);
  for (std::size_t n = 0; n < resp.size(); ++n) CHECK_FALSE(decode_forward_responses(resp.substr(0, n)).ok());
  CHECK_FALSE(decode_forward_responses(resp + 'x').ok());

  // Random bodies, with and without the magic, never decode into something that does
  // not encode back to themselves.
  for (int i = 0; i < 20'000; ++i) {
    std::string junk = (i % 2 ? "KSF1" : "") + random_bytes(rng, 64);
    if (auto d = decode_forward_requests(junk); d.ok()) CHECK(encode_forward_requests(*d) == junk);
    if (auto d = decode_forward_responses(junk); d.ok()) CHECK(encode_forward_responses(*d) == junk);
  }
}

TEST_CASE("forward batch: counts, lengths and fields beyond the bounds are refused") {
  const std::string one = be(0, 1) + str("/a") + str("") + str("") + str("id");
  // No request, and more than the bound (with enough bytes to hold them).
  CHECK_FALSE(decode_forward_requests(std::string("KSF1") + be(0, 2)).ok());
  std::string many = std::string("KSF1") + be(max_forwards_per_batch + 1, 2);
  for (std::size_t i = 0; i <= max_forwards_per_batch; ++i) many += one;
  CHECK_FALSE(decode_forward_requests(many).ok());
  std::string most = std::string("KSF1") + be(max_forwards_per_batch, 2);
  for (std::size_t i = 0; i < max_forwards_per_batch; ++i) most += one;
  CHECK(decode_forward_requests(most).ok());
  // A count the remaining bytes cannot hold.
  CHECK_FALSE(decode_forward_requests(std::string("KSF1") + be(1000, 2) + one).ok());
  // A length far beyond the body, a target over the bound, a target not in origin form.
  CHECK_FALSE(decode_forward_requests(std::string("KSF1") + be(1, 2) + be(0, 1) + be(0xffffffff, 4) + "/a").ok());
  const std::string long_target = "/" + std::string(max_forward_target_bytes, 'a');
  CHECK_FALSE(decode_forward_requests(std::string("KSF1") + be(1, 2) + be(0, 1) + str(long_target) + str("") + str("") +
                                      str("id"))
                  .ok());
  CHECK_FALSE(
      decode_forward_requests(std::string("KSF1") + be(1, 2) + be(0, 1) + str("a") + str("") + str("") + str("")).ok());
  // Unknown flags; a header value without its flag.
  CHECK_FALSE(
      decode_forward_requests(std::string("KSF1") + be(1, 2) + be(4, 1) + str("/a") + str("") + str("") + str(""))
          .ok());
  CHECK_FALSE(
      decode_forward_requests(std::string("KSF1") + be(1, 2) + be(0, 1) + str("/a") + str("x") + str("") + str(""))
          .ok());
  // The wrong magic.
  CHECK_FALSE(decode_forward_requests(std::string("KSF2") + be(1, 2) + one).ok());

  // Answers: too many headers, a status out of range, an empty header name.
  std::string headers =
      std::string("KSF1") + be(1, 2) + be(200, 2) + str("t") + be(max_forward_response_headers + 1, 2);
  for (std::size_t i = 0; i <= max_forward_response_headers; ++i) headers += str("n") + str("v");
  CHECK_FALSE(decode_forward_responses(headers + str("")).ok());
  CHECK_FALSE(
      decode_forward_responses(std::string("KSF1") + be(1, 2) + be(600, 2) + str("t") + be(0, 2) + str("")).ok());
  CHECK_FALSE(decode_forward_responses(std::string("KSF1") + be(1, 2) + be(200, 2) + str("t") + be(1, 2) + str("") +
                                       str("v") + str(""))
                  .ok());

  // What the forwarder may put in a batch.
  forward_sub_request r{"/v1/stores/s/keys/k", "application/json", std::nullopt, "id"};
  CHECK(fits_forward_batch(r));
  r.target = long_target;
  CHECK_FALSE(fits_forward_batch(r));
  r.target = "/a";
  r.accept = std::string(max_forward_header_bytes + 1, 'x');
  CHECK_FALSE(fits_forward_batch(r));
}
