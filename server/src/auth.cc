#include "server/auth.h"
#include "log.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>

namespace kstate::server {

std::string sha256_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) != 1 || len != 32)
    throw std::runtime_error("SHA-256 failed");  // only when OpenSSL itself is broken
  static const char digits[] = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned i = 0; i < 32; ++i) {
    out[2 * i] = digits[md[i] >> 4];
    out[2 * i + 1] = digits[md[i] & 15];
  }
  return out;
}

std::string random_token() {
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) throw std::runtime_error("no randomness available (RAND_bytes failed)");
  static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char b : raw) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(alphabet[(acc >> bits) & 63]);
    }
  }
  if (bits > 0) out.push_back(alphabet[(acc << (6 - bits)) & 63]);
  return out;
}

bool token_scopes::store_allowed(std::string_view store) const {
  for (const auto& s : stores) {
    if (!s.empty() && s.back() == '*') {
      if (store.substr(0, s.size() - 1) == std::string_view(s).substr(0, s.size() - 1)) return true;
    } else if (s == store) {
      return true;
    }
  }
  return false;
}

namespace {

struct token_error {
  std::string message;
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool get_bool(const YAML::Node& n, const std::string& where) {
  if (!n.IsScalar()) throw token_error{where + ": must be true or false"};
  try {
    return n.as<bool>();
  } catch (const YAML::Exception&) {
    throw token_error{where + ": must be true or false (got '" + n.Scalar() + "')"};
  }
}

std::vector<token_entry> parse_tokens(const YAML::Node& root) {
  if (!root || root.IsNull()) throw token_error{"the token file is empty (expected a 'tokens' list)"};
  if (!root.IsMap()) throw token_error{"must be a mapping with a 'tokens' list"};
  for (const auto& kv : root)
    if (kv.first.as<std::string>() != "tokens")
      throw token_error{kv.first.as<std::string>() + ": unknown key (allowed: tokens)"};
  if (!root["tokens"]) throw token_error{"tokens: is required (a list of tokens)"};
  const auto list = root["tokens"];
  if (!list.IsSequence()) throw token_error{"tokens: must be a list"};
  std::vector<token_entry> out;
  std::set<std::string> names, hashes;
  for (size_t i = 0; i < list.size(); ++i) {
    const auto n = list[i];
    std::string where = "tokens[" + std::to_string(i) + "]";
    if (!n.IsMap()) throw token_error{where + ": must be a mapping"};
    static const std::set<std::string> allowed{"name", "sha256", "stores", "cluster", "metrics"};
    for (const auto& kv : n) {
      auto k = kv.first.as<std::string>();
      if (!allowed.count(k))
        throw token_error{where + "." + k + ": unknown key (allowed: cluster, metrics, name, sha256, stores)"};
    }
    token_entry e;
    if (!n["name"] || !n["name"].IsScalar() || n["name"].Scalar().empty())
      throw token_error{where + ".name: is required"};
    e.name = n["name"].Scalar();
    where = "tokens[" + std::to_string(i) + "] (" + e.name + ")";
    if (!names.insert(e.name).second) throw token_error{where + ".name: duplicate name"};
    if (!n["sha256"] || !n["sha256"].IsScalar())
      throw token_error{where + ".sha256: is required (the output of `kstate token hash`)"};
    const std::string hex = n["sha256"].Scalar();
    if (hex.size() != 64)
      throw token_error{where + ".sha256: must be 64 hex digits (got " + std::to_string(hex.size()) + " characters)"};
    for (size_t b = 0; b < 32; ++b) {
      int hi = hex_value(hex[2 * b]), lo = hex_value(hex[2 * b + 1]);
      if (hi < 0 || lo < 0) throw token_error{where + ".sha256: must be 64 hex digits"};
      e.hash[b] = static_cast<unsigned char>(hi * 16 + lo);
    }
    if (!hashes.insert(std::string(e.hash.begin(), e.hash.end())).second)
      throw token_error{where + ".sha256: the same hash is listed twice"};
    if (auto s = n["stores"]) {
      if (s.IsScalar()) {
        e.scopes.stores.push_back(s.Scalar());
      } else if (s.IsSequence()) {
        for (const auto& x : s) {
          if (!x.IsScalar() || x.Scalar().empty())
            throw token_error{where + ".stores: entries must be non-empty strings"};
          e.scopes.stores.push_back(x.Scalar());
        }
      } else {
        throw token_error{where + ".stores: must be a list of store names or prefixes (\"orders*\")"};
      }
      for (const auto& st : e.scopes.stores)
        if (auto star = st.find('*'); star != std::string::npos && star + 1 != st.size())
          throw token_error{where + ".stores: '" + st + "': '*' may only end an entry (a prefix)"};
    }
    if (n["cluster"]) e.scopes.cluster = get_bool(n["cluster"], where + ".cluster");
    if (n["metrics"]) e.scopes.metrics = get_bool(n["metrics"], where + ".metrics");
    out.push_back(std::move(e));
  }
  return out;
}

long long mtime_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<long long>(st.st_mtim.tv_sec) * 1'000'000'000LL + st.st_mtim.tv_nsec;
}

}  // namespace

result<std::vector<token_entry>> parse_token_file(const std::string& yaml_text, const std::string& source) {
  try {
    return parse_tokens(YAML::Load(yaml_text));
  } catch (const token_error& e) {
    return status::invalid_argument(source + ": " + e.message);
  } catch (const YAML::Exception& e) {
    return status::invalid_argument(source + ": invalid YAML: " + e.what());
  }
}

result<std::vector<token_entry>> load_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return status::invalid_argument("cannot read token file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_token_file(ss.str(), path);
}

struct token_authenticator::table {
  std::vector<token_entry> entries;
  std::vector<std::shared_ptr<const principal>> principals;  // same order

  explicit table(std::vector<token_entry> e) : entries(std::move(e)) {
    for (const auto& x : entries) principals.push_back(std::make_shared<const principal>(principal{x.name, x.scopes}));
  }
};

token_authenticator::token_authenticator(std::vector<token_entry> tokens)
    : tokens_(std::make_shared<const table>(std::move(tokens))) {}

result<std::shared_ptr<token_authenticator>> token_authenticator::from_file(const std::string& path) {
  auto mtime = mtime_of(path);
  auto tokens = load_token_file(path);
  if (!tokens.ok()) return tokens.error();
  auto a = std::make_shared<token_authenticator>(std::move(tokens.value()));
  a->path_ = path;
  a->mtime_ns_ = mtime;
  a->next_check_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  return a;
}

void token_authenticator::maybe_reload() const {
  // Called with mu_ held.
  const auto now = std::chrono::steady_clock::now();
  if (path_.empty() || now < next_check_) return;
  next_check_ = now + std::chrono::seconds(1);
  auto mtime = mtime_of(path_);
  if (mtime == mtime_ns_) return;
  mtime_ns_ = mtime;
  auto tokens = load_token_file(path_);
  if (!tokens.ok()) {
    server_log()->error("token file changed but cannot be used, keeping the previous tokens: {}",
                        tokens.error().message());
    return;
  }
  tokens_ = std::make_shared<const table>(std::move(tokens.value()));
  server_log()->info("token file {} reloaded: {} token(s)", path_, tokens_->entries.size());
}

std::shared_ptr<const principal> token_authenticator::authenticate(
    std::optional<std::string_view> authorization) const {
  std::shared_ptr<const table> t;
  {
    std::lock_guard lk(mu_);
    maybe_reload();
    t = tokens_;
  }
  if (!authorization) return nullptr;
  std::string_view v = *authorization;
  // RFC 6750: "Bearer" (case-insensitive auth scheme), one or more spaces, the token.
  constexpr std::string_view scheme = "bearer";
  if (v.size() <= scheme.size()) return nullptr;
  for (size_t i = 0; i < scheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(v[i])) != scheme[i]) return nullptr;
  v.remove_prefix(scheme.size());
  if (v.front() != ' ') return nullptr;
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty()) return nullptr;

  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(v.data(), v.size(), md, &len, EVP_sha256(), nullptr) != 1 || len != 32) return nullptr;
  // Every entry is compared, whatever matched before: the time taken depends only on
  // the number of entries.
  std::shared_ptr<const principal> found;
  for (size_t i = 0; i < t->entries.size(); ++i) {
    const bool eq = CRYPTO_memcmp(md, t->entries[i].hash.data(), 32) == 0;
    if (eq) found = t->principals[i];
  }
  return found;
}

size_t token_authenticator::size() const {
  std::lock_guard lk(mu_);
  return tokens_->entries.size();
}

}  // namespace kstate::server
