// Fuzz target: the byte layout of windowed keys (core/src/window.cc).
//
// Properties, from core/window.h:
// - decode(encode(key, start)) == (key, start), and encode(decode(bytes)) == bytes
//   whenever bytes decode (one encoding per pair);
// - byte order of encodings is the order of (key as bytes, start as signed number);
// - every window of a key starts with windowed_key_prefix(key), and key < to (as
//   bytes) exactly when encode(key, start) < windowed_key_prefix(to), so a key range
//   [from, to) is the encoded range [prefix(from), prefix(to)).

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/window.h"
#include "fuzz_check.h"

namespace {

int sign(int v) { return (v > 0) - (v < 0); }

int compare_pairs(const std::string& k1, int64_t s1, const std::string& k2, int64_t s2) {
  if (int c = k1.compare(k2); c != 0) return sign(c);
  return (s1 > s2) - (s1 < s2);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kstate::decode_windowed_key;
  using kstate::encode_windowed_key;
  using kstate::windowed_key_prefix;

  // The whole input as stored bytes.
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (auto d = decode_windowed_key(bytes)) FUZZ_CHECK(encode_windowed_key(d->key, d->start) == bytes);

  // The input as two (key, start) pairs.
  FuzzedDataProvider in(data, size);
  const std::string k1 = in.ConsumeRandomLengthString();
  const std::string k2 = in.ConsumeRandomLengthString();
  const auto s1 = in.ConsumeIntegral<int64_t>();
  const auto s2 = in.ConsumeIntegral<int64_t>();
  const std::string e1 = encode_windowed_key(k1, s1);
  const std::string e2 = encode_windowed_key(k2, s2);

  auto d1 = decode_windowed_key(e1);
  FUZZ_CHECK(d1 && d1->key == k1 && d1->start == s1);
  FUZZ_CHECK(sign(e1.compare(e2)) == compare_pairs(k1, s1, k2, s2));
  FUZZ_CHECK(e1.rfind(windowed_key_prefix(k1), 0) == 0);
  FUZZ_CHECK((k1 < k2) == (e1 < windowed_key_prefix(k2)));
  FUZZ_CHECK((k1 >= k2) == (e1 >= windowed_key_prefix(k2)));
  return 0;
}
