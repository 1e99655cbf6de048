#include "core/window.h"

#include <charconv>
#include <chrono>
#include <limits>
#include <utility>

#include <fmt/format.h>

namespace kstate {

namespace {

constexpr int64_t k_day_ms = 24LL * 3600 * 1000;

// Parses all of `s` as a non-negative decimal integer.
bool parse_uint(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size() && out >= 0;
}

// Fixed-width decimal field, e.g. the "12" of "2026-12-02".
bool field(std::string_view s, size_t pos, size_t len, int& out) {
  if (pos + len > s.size()) return false;
  int64_t v = 0;
  for (size_t i = pos; i < pos + len; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  out = static_cast<int>(v);
  return true;
}

// The longest size, advance, grace or retention: 100 years. Sums of durations then
// never overflow; a window start (any int64 an event time can be) plus a duration may,
// and is compared with ends_by.
constexpr int64_t k_max_duration_ms = 36'525 * k_day_ms;

// start + span <= t, exactly, for span >= 0: a window whose end lies past the largest
// int64 never closes, instead of wrapping around into the past.
bool ends_by(int64_t start, int64_t span, int64_t t) noexcept {
  int64_t end = 0;
  return !__builtin_add_overflow(start, span, &end) && end <= t;
}

// Floor division: window starts are aligned for negative numbers too.
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

const char* to_string(window_type t) noexcept {
  switch (t) {
    case window_type::tumbling: return "tumbling";
    case window_type::hopping: return "hopping";
    case window_type::session: return "session";
  }
  return "tumbling";
}

bool parse_window_type(std::string_view s, window_type& out) noexcept {
  if (s == "tumbling") {
    out = window_type::tumbling;
    return true;
  }
  if (s == "hopping") {
    out = window_type::hopping;
    return true;
  }
  if (s == "session") {
    out = window_type::session;
    return true;
  }
  return false;
}

status normalize(window_spec& spec) {
  for (auto [field, ms] : {std::pair{"size", spec.size_ms}, std::pair{"advance", spec.advance_ms},
                           std::pair{"inactivity_gap", spec.gap_ms}, std::pair{"grace", spec.grace_ms},
                           std::pair{"retention", spec.retention_ms}})
    if (ms > k_max_duration_ms)
      return status::invalid_argument(fmt::format("{}: must be at most 100 years ({} ms)", field, k_max_duration_ms));
  if (spec.type == window_type::session) {
    if (spec.size_ms != 0) return status::invalid_argument("size: sessions have no size; give inactivity_gap");
    if (spec.advance_ms != 0) return status::invalid_argument("advance: sessions do not advance; give inactivity_gap");
    if (spec.gap_ms <= 0) return status::invalid_argument("inactivity_gap: must be a positive duration");
    if (spec.grace_ms < 0) return status::invalid_argument("grace: must not be negative");
    const int64_t min_retention = spec.gap_ms + spec.grace_ms;
    if (spec.retention_ms == 0) spec.retention_ms = std::max(k_day_ms, min_retention);
    if (spec.retention_ms < min_retention)
      return status::invalid_argument(
          fmt::format("retention: must be at least inactivity_gap + grace ({} ms), or sessions would expire before "
                      "they close",
                      min_retention));
    if (spec.max_future_ms < 0) return status::invalid_argument("max_future: must not be negative");
    return {};
  }
  if (spec.gap_ms != 0) return status::invalid_argument("inactivity_gap: only session windows have one");
  if (spec.size_ms <= 0) return status::invalid_argument("size: must be a positive duration");
  if (spec.type == window_type::tumbling) {
    if (spec.advance_ms != 0 && spec.advance_ms != spec.size_ms)
      return status::invalid_argument("advance: tumbling windows advance by their size; use type hopping");
    spec.advance_ms = spec.size_ms;
  } else if (spec.advance_ms <= 0 || spec.advance_ms > spec.size_ms) {
    return status::invalid_argument("advance: hopping windows need 0 < advance <= size");
  }
  if (spec.grace_ms < 0) return status::invalid_argument("grace: must not be negative");
  const int64_t min_retention = spec.size_ms + spec.grace_ms;
  if (spec.retention_ms == 0) spec.retention_ms = std::max(k_day_ms, min_retention);
  if (spec.retention_ms < min_retention)
    return status::invalid_argument(fmt::format(
        "retention: must be at least size + grace ({} ms), or windows would expire before they close", min_retention));
  if (spec.max_future_ms < 0) return status::invalid_argument("max_future: must not be negative");
  return {};
}

bool is_session(const window_spec& spec) noexcept { return spec.type == window_type::session; }

std::vector<int64_t> window_starts(const window_spec& spec, int64_t ts) {
  std::vector<int64_t> starts;
  if (ts < 0 || spec.advance_ms <= 0 || is_session(spec)) return starts;
  // The last window containing ts starts at the aligned start at or before ts; earlier
  // ones follow every `advance` while they still reach past ts.
  // Written so that nothing passes the int64 range for any ts >= 0: stepping past
  // `last` near the largest int64 used to wrap around and loop without end.
  const int64_t last = floor_div(ts, spec.advance_ms) * spec.advance_ms;
  int64_t first = last;
  while (first >= spec.advance_ms && first - spec.advance_ms > ts - spec.size_ms) first -= spec.advance_ms;
  for (int64_t s = first;; s += spec.advance_ms) {
    starts.push_back(s);
    if (s == last) break;
  }
  return starts;
}

bool window_closed(const window_spec& spec, int64_t start, int64_t stream_time) noexcept {
  return ends_by(start, spec.size_ms + spec.grace_ms, stream_time);
}

bool window_expired(const window_spec& spec, int64_t start, int64_t stream_time) noexcept {
  return ends_by(start, spec.size_ms + spec.retention_ms, stream_time);
}

int64_t first_live_start(const window_spec& spec, int64_t stream_time) noexcept {
  // window_expired(s) <=> s <= stream_time - size - retention; when that is below the
  // int64 range, every start is live.
  int64_t last_expired = 0;
  if (__builtin_sub_overflow(stream_time, spec.size_ms + spec.retention_ms, &last_expired))
    return std::numeric_limits<int64_t>::min();
  return last_expired + 1;
}

bool session_reaches(const window_spec& spec, int64_t start, int64_t last, int64_t t) noexcept {
  // t >= start - gap and t <= last + gap, written as differences that cannot overflow
  // for the event times records carry (>= 0) and durations of at most 100 years.
  int64_t lo = 0, hi = 0;
  const bool lo_ok = !__builtin_sub_overflow(start, spec.gap_ms, &lo);
  const bool hi_ok = !__builtin_add_overflow(last, spec.gap_ms, &hi);
  return (!lo_ok || t >= lo) && (!hi_ok || t <= hi);
}

bool session_closed(const window_spec& spec, int64_t last, int64_t stream_time) noexcept {
  // last + gap + grace < stream time, i.e. the half-open end (last + 1) + gap + grace
  // reached, as window_closed says of the other windows.
  return ends_by(last, spec.gap_ms + spec.grace_ms + 1, stream_time);
}

bool session_expired(const window_spec& spec, int64_t last, int64_t stream_time) noexcept {
  return ends_by(last, spec.retention_ms + 1, stream_time);
}

int64_t first_live_last(const window_spec& spec, int64_t stream_time) noexcept {
  // session_expired(last) <=> last <= stream_time - retention - 1.
  int64_t last_expired = 0;
  if (__builtin_sub_overflow(stream_time, spec.retention_ms + 1, &last_expired))
    return std::numeric_limits<int64_t>::min();
  return last_expired + 1;
}

bool beyond_max_future(const window_spec& spec, int64_t ts, int64_t now_ms) noexcept {
  // ts - now_ms computed without overflow: it is positive and below 2^64 when ts > now_ms.
  return ts > now_ms &&
         static_cast<uint64_t>(ts) - static_cast<uint64_t>(now_ms) > static_cast<uint64_t>(spec.max_future_ms);
}

result<int64_t> parse_duration_ms(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  int64_t n = 0;
  if (!parse_uint(text.substr(0, digits), n))
    return status::invalid_argument(fmt::format("'{}' is not a duration (e.g. 250ms, 10s, 1m, 24h, 7d)", text));
  const std::string_view unit = text.substr(digits);
  int64_t scale = 0;
  if (unit.empty() || unit == "ms") scale = 1;
  else if (unit == "s") scale = 1000;
  else if (unit == "m") scale = 60'000;
  else if (unit == "h") scale = 3'600'000;
  else if (unit == "d") scale = k_day_ms;
  else return status::invalid_argument(fmt::format("'{}' has an unknown unit (use ms, s, m, h or d)", text));
  if (n > std::numeric_limits<int64_t>::max() / scale)
    return status::invalid_argument(fmt::format("'{}' is too long", text));
  return n * scale;
}

result<int64_t> parse_timestamp_ms(std::string_view text) {
  int64_t epoch = 0;
  if (parse_uint(text, epoch)) return epoch;
  if (!text.empty() && text[0] == '-' && parse_uint(text.substr(1), epoch)) return -epoch;

  auto bad = [&] {
    return status::invalid_argument(
        fmt::format("'{}' is not a timestamp: give epoch milliseconds or ISO-8601 with a zone, e.g. "
                    "2026-12-02T10:00:00Z",
                    text));
  };
  // YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  if (text.size() < 20 || !field(text, 0, 4, y) || text[4] != '-' || !field(text, 5, 2, mo) || text[7] != '-' ||
      !field(text, 8, 2, d) || (text[10] != 'T' && text[10] != 't' && text[10] != ' ') || !field(text, 11, 2, h) ||
      text[13] != ':' || !field(text, 14, 2, mi) || text[16] != ':' || !field(text, 17, 2, s))
    return bad();
  using namespace std::chrono;
  const year_month_day ymd{year{y}, month{static_cast<unsigned>(mo)}, day{static_cast<unsigned>(d)}};
  if (!ymd.ok() || h > 23 || mi > 59 || s > 60) return bad();

  size_t pos = 19;
  int64_t frac_ms = 0;
  if (pos < text.size() && text[pos] == '.') {
    size_t n = 0;
    ++pos;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      // Milliseconds from the first three digits; finer digits are truncated.
      if (n < 3) frac_ms = frac_ms * 10 + (text[pos] - '0');
      ++n;
      ++pos;
    }
    if (n == 0) return bad();
    for (; n < 3; ++n) frac_ms *= 10;
  }
  int64_t offset_ms = 0;
  const std::string_view zone = text.substr(pos);
  if (zone == "Z" || zone == "z") {
    offset_ms = 0;
  } else if (zone.size() == 6 && (zone[0] == '+' || zone[0] == '-') && zone[3] == ':') {
    int zh = 0, zm = 0;
    if (!field(zone, 1, 2, zh) || !field(zone, 4, 2, zm) || zh > 23 || zm > 59) return bad();
    offset_ms = (zh * 60LL + zm) * 60'000 * (zone[0] == '+' ? 1 : -1);
  } else {
    return bad();
  }
  const int64_t days = sys_days{ymd}.time_since_epoch().count();
  return days * k_day_ms + ((h * 60LL + mi) * 60 + s) * 1000 + frac_ms - offset_ms;
}

std::string format_timestamp_ms(int64_t ms) {
  // The date is computed here in int64 rather than with std::chrono::year_month_day,
  // whose year is 16 bits: every int64 instant (event times come from records) gets its
  // true date. Days since 1970-01-01 are shifted to days since 0000-03-01 and split
  // into 400-year eras of 146097 days; March-based years put the leap day last.
  const int64_t day_count = floor_div(ms, k_day_ms);
  int64_t rem = ms % k_day_ms;  // not ms - day_count * k_day_ms: that overflows near INT64_MIN
  if (rem < 0) rem += k_day_ms;
  const int64_t z = day_count + 719'468;
  const int64_t era = floor_div(z, 146'097);
  const int64_t doe = z - era * 146'097;                                         // [0, 146096]
  const int64_t yoe = (doe - doe / 1'460 + doe / 36'524 - doe / 146'096) / 365;  // [0, 399]
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);                   // [0, 365]
  const int64_t mp = (5 * doy + 2) / 153;                                        // March = 0
  const int64_t day = doy - (153 * mp + 2) / 5 + 1;
  const int64_t month = mp < 10 ? mp + 3 : mp - 9;
  const int64_t year = yoe + era * 400 + (month <= 2 ? 1 : 0);
  const int64_t h = rem / 3'600'000;
  rem %= 3'600'000;
  const int64_t mi = rem / 60'000;
  rem %= 60'000;
  // RFC 3339 has four-digit years only; outside 0000-9999 the year is written as ISO
  // 8601's expanded form with a sign and six digits, as JavaScript's toISOString does.
  const std::string y = year >= 0 && year <= 9999
                            ? fmt::format("{:04}", year)
                            : fmt::format("{}{:06}", year < 0 ? '-' : '+', year < 0 ? -year : year);
  return fmt::format("{}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", y, month, day, h, mi, rem / 1000, rem % 1000);
}

std::string windowed_key_prefix(std::string_view key) {
  std::string out;
  out.reserve(key.size() + 2);
  for (char c : key) {
    out.push_back(c);
    if (c == '\0') out.push_back('\xff');
  }
  out.push_back('\0');
  out.push_back('\0');
  return out;
}

std::string encode_windowed_key(std::string_view key, int64_t start) {
  std::string out = windowed_key_prefix(key);
  const uint64_t u = static_cast<uint64_t>(start) ^ (uint64_t{1} << 63);
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>((u >> shift) & 0xff));
  return out;
}

std::optional<windowed_key> decode_windowed_key(std::string_view bytes) {
  windowed_key out;
  size_t i = 0;
  for (;;) {
    if (i >= bytes.size()) return std::nullopt;
    const char c = bytes[i];
    if (c != '\0') {
      out.key.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 >= bytes.size()) return std::nullopt;
    if (bytes[i + 1] == '\xff') {
      out.key.push_back('\0');
      i += 2;
      continue;
    }
    if (bytes[i + 1] != '\0') return std::nullopt;
    i += 2;
    break;
  }
  if (bytes.size() - i != 8) return std::nullopt;
  uint64_t u = 0;
  for (size_t j = 0; j < 8; ++j) u = (u << 8) | static_cast<unsigned char>(bytes[i + j]);
  out.start = static_cast<int64_t>(u ^ (uint64_t{1} << 63));
  return out;
}

}  // namespace kstate
