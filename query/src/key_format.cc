#include "query/key_format.h"

#include <openssl/evp.h>

#include <charconv>
#include <nlohmann/json.hpp>

#include "core/json_check.h"
#include "core/utf8.h"

namespace kstate::query {

bool parse_key_format(std::string_view name, key_format& out) noexcept {
  if (name == "string") out = key_format::string;
  else if (name == "base64url") out = key_format::base64url;
  else if (name == "long") out = key_format::long_be;
  else if (name == "json") out = key_format::json;
  else return false;
  return true;
}

const char* to_string(key_format f) noexcept {
  switch (f) {
    case key_format::string: return "string";
    case key_format::base64url: return "base64url";
    case key_format::long_be: return "long";
    case key_format::json: return "json";
  }
  return "unknown";
}

std::string base64_encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string base64url_encode(std::string_view bytes) {
  auto s = base64_encode(bytes);
  while (!s.empty() && s.back() == '=') s.pop_back();
  for (auto& c : s) {
    if (c == '+') c = '-';
    else if (c == '/') c = '_';
  }
  return s;
}

result<std::string> base64url_decode(std::string_view text) {
  std::string s;
  s.reserve(text.size() + 3);
  size_t pad = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '=') {
      // Padding only at the end.
      for (size_t j = i; j < text.size(); ++j)
        if (text[j] != '=') return status::invalid_argument("invalid base64url: '=' inside the text");
      pad = text.size() - i;
      break;
    }
    if (c == '-') c = '+';
    else if (c == '_') c = '/';
    else if (!std::isalnum(static_cast<unsigned char>(c)))
      return status::invalid_argument("invalid base64url character");
    s.push_back(c);
  }
  if (s.size() % 4 == 1) return status::invalid_argument("invalid base64url: impossible length");
  size_t missing = (4 - s.size() % 4) % 4;
  if (pad && pad != missing) return status::invalid_argument("invalid base64url: wrong padding");
  s.append(missing, '=');
  std::string out(s.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) return status::invalid_argument("invalid base64url");
  // EVP_DecodeBlock counts padding as zero bytes; drop them.
  out.resize(static_cast<size_t>(n) - missing);
  // Reject non-canonical encodings (stray bits in the last character), so each key has
  // exactly one spelling.
  if (base64url_encode(out) != text.substr(0, text.size() - pad))
    return status::invalid_argument("invalid base64url: non-canonical encoding");
  return out;
}

result<std::string> decode_key(key_format f, std::string_view text, int max_json_depth) {
  switch (f) {
    case key_format::string:
      if (!valid_utf8(text)) return status::invalid_argument("key is not valid UTF-8 (key_format=string)");
      return std::string(text);
    case key_format::base64url: return base64url_decode(text);
    case key_format::long_be: {
      int64_t v = 0;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || ptr != text.data() + text.size() || text.empty())
        return status::invalid_argument("key is not a signed 64-bit decimal integer (key_format=long)");
      std::string out(8, '\0');
      auto u = static_cast<uint64_t>(v);
      for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(u >> (56 - 8 * i));
      return out;
    }
    case key_format::json: {
      switch (check_json(text, max_json_depth)) {
        case json_verdict::ok: break;
        case json_verdict::invalid: return status::invalid_argument("key is not valid JSON (key_format=json)");
        case json_verdict::too_deep:
          return status::invalid_argument("key is nested deeper than max_json_depth (" +
                                          std::to_string(max_json_depth) + ") (key_format=json)");
      }
      auto j = nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, false);
      if (j.is_discarded()) return status::invalid_argument("key is not valid JSON (key_format=json)");
      return j.dump();
    }
  }
  return status::invalid_argument("unknown key format");
}

}  // namespace kstate::query
