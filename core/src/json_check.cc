// check_json(): see core/json_check.h.
//
// It must accept exactly what nlohmann::json::accept() accepts, since that is what the
// rest of kstate parses later (tests/core compares the two on generated input). Unlike
// nlohmann's lexer it builds no token strings and runs one loop over the bytes, with an
// explicit stack of open containers instead of recursion; the stack is what the depth
// bound limits.

#include "core/json_check.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/utf8.h"

namespace kstate {
namespace {

class checker {
 public:
  checker(std::string_view s, int max_depth, json_layout layout)
      : begin_(s.data()),
        p_(s.data()),
        end_(s.data() + s.size()),
        max_depth_(max_depth < 0 ? 0 : static_cast<size_t>(max_depth)),
        compact_(layout == json_layout::compact) {}

  // Bytes from the start to where run() stopped.
  size_t consumed() const { return static_cast<size_t>(p_ - begin_); }

  json_verdict run() {
    if (!compact_ && end_ - p_ >= 3 && std::memcmp(p_, "\xEF\xBB\xBF", 3) == 0) p_ += 3;
    for (;;) {
      // A value is expected.
      ws();
      if (p_ == end_) return json_verdict::invalid;
      char c = *p_;
      if (c == '{' || c == '[') {
        // The container about to open is stack_.size() + 1 deep, empty or not.
        if (stack_.size() >= max_depth_) return json_verdict::too_deep;
        ++p_;
        ws();
        const char close = c == '{' ? '}' : ']';
        if (p_ != end_ && *p_ == close) {
          ++p_;
        } else {
          stack_.push_back(c);
          if (c == '{' && !member_name()) return json_verdict::invalid;
          continue;
        }
      } else if (c == '"') {
        if (!string()) return json_verdict::invalid;
      } else if (c == 't') {
        if (!word("true")) return json_verdict::invalid;
      } else if (c == 'f') {
        if (!word("false")) return json_verdict::invalid;
      } else if (c == 'n') {
        if (!word("null")) return json_verdict::invalid;
      } else if (c == '-' || (c >= '0' && c <= '9')) {
        if (!number()) return json_verdict::invalid;
      } else {
        return json_verdict::invalid;
      }
      // After a value: close containers, or find the next value.
      for (;;) {
        ws();
        // nlohmann's lexer takes a NUL byte for the end of the input, so whatever
        // follows one after a complete document is ignored.
        if (stack_.empty()) return p_ == end_ || (!compact_ && *p_ == '\0') ? json_verdict::ok : json_verdict::invalid;
        if (p_ == end_) return json_verdict::invalid;
        char top = stack_.back();
        if (*p_ == ',') {
          ++p_;
          if (top == '{' && !member_name()) return json_verdict::invalid;
          break;
        }
        if ((top == '{' && *p_ == '}') || (top == '[' && *p_ == ']')) {
          ++p_;
          stack_.pop_back();
          continue;
        }
        return json_verdict::invalid;
      }
    }
  }

 private:
  // Whitespace is skipped; in a compact text it is left, for the caller to refuse as an
  // unexpected byte.
  void ws() {
    if (compact_) return;
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  // "name" : (the value follows)
  bool member_name() {
    ws();
    if (p_ == end_ || *p_ != '"' || !string()) return false;
    ws();
    if (p_ == end_ || *p_ != ':') return false;
    ++p_;
    return true;
  }

  bool word(const char* w) {
    size_t n = std::strlen(w);
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, w, n) != 0) return false;
    p_ += n;
    return true;
  }

  int hex4() {
    if (end_ - p_ < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = p_[i];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    p_ += 4;
    return v;
  }

  // UTF-8 validity of the bytes is checked once for the whole document (check_json).
  bool string() {
    ++p_;  // opening quote
    for (;;) {
      if (p_ == end_) return false;
      auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return true;
      }
      if (c < 0x20) return false;
      ++p_;
      if (c != '\\') continue;
      if (p_ == end_) return false;
      char e = *p_++;
      switch (e) {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't': break;
        case 'u': {
          int cp = hex4();
          if (cp < 0) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return false;  // a low surrogate alone
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
            p_ += 2;
            int lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) return false;
          }
          break;
        }
        default: return false;
      }
    }
  }

  bool digits() {
    const char* start = p_;
    while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    return p_ != start;
  }

  bool number() {
    const char* start = p_;
    bool negative = *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_) return false;
    if (*p_ == '0') {
      ++p_;
    } else if (!digits()) {
      return false;
    }
    // Digits before the point ('0' counts as one).
    const size_t whole_digits = static_cast<size_t>(p_ - start) - (negative ? 1 : 0);
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      if (!digits()) return false;
    }
    bool exponent = false;
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digits()) return false;
      exponent = true;
    }
    // nlohmann converts an integer with strtoull/strtoll, and one out of 64-bit range
    // and every fraction with strtod; accept() refuses the number when that double is
    // not finite. Without an exponent and with at most 308 digits before the point, the
    // number is below 10^308 < DBL_MAX: finite however it is converted.
    if (!exponent && whole_digits <= 308) return true;
    // strtod needs a terminated string.
    const size_t len = static_cast<size_t>(p_ - start);
    char small[64];
    std::string large;
    const char* token = small;
    if (len < sizeof small) {
      std::memcpy(small, start, len);
      small[len] = '\0';
    } else {
      large.assign(start, len);
      token = large.c_str();
    }
    char* stop = nullptr;
    return std::isfinite(std::strtod(token, &stop));
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  size_t max_depth_;
  bool compact_;
  std::string stack_;  // '{' or '[' per open container; at most max_depth_ long
};

}  // namespace

json_verdict check_json(std::string_view text, int max_depth, json_layout layout) {
  checker c(text, max_depth, layout);
  if (auto v = c.run(); v != json_verdict::ok) return v;
  // The bytes the document spans must be valid UTF-8 (only strings can hold non-ASCII
  // bytes; the structure check refuses them anywhere else). Bytes after a terminating
  // NUL are never looked at, as in nlohmann.
  return valid_utf8(text.substr(0, c.consumed())) ? json_verdict::ok : json_verdict::invalid;
}

}  // namespace kstate
