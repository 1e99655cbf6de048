#pragma once
// Time windows of windowed aggregate views: their definition, which windows a record
// falls into, when a window closes and expires, and how a (key, window) pair is laid
// out as bytes.
//
// Windows are aligned to the epoch, as in Kafka Streams: a window is [start, start +
// size) with start a multiple of `advance` (tumbling windows: advance == size). Event
// time is in milliseconds since the epoch.
//
// Closing and expiry are judged against stream time: the largest event time a
// partition has seen. A window accepts records while end + grace > stream time; its
// value is kept (and answered) while end > stream time - retention.
//
// Session windows (Kafka Streams' SessionWindows) are not aligned: a session of a key
// is a maximal run of its records whose event times are at most `gap` apart. It is
// kept as its first and last record times, [start, last]; it is answered as the
// half-open [start, last + 1), like the other windows. A record at t joins every
// session with start - gap <= t <= last + gap, merging them when it reaches several.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kstate {

enum class window_type { tumbling, hopping, session };

const char* to_string(window_type t) noexcept;
bool parse_window_type(std::string_view s, window_type& out) noexcept;

struct window_spec {
  window_type type = window_type::tumbling;
  // Window length, ms. Required, > 0, for tumbling and hopping windows; 0 for sessions.
  int64_t size_ms = 0;
  // Distance between the starts of consecutive windows, ms. Tumbling: equal to size.
  // Hopping: 0 < advance <= size.
  int64_t advance_ms = 0;
  // Sessions: the inactivity gap, ms. Required, > 0, for sessions; 0 otherwise.
  int64_t gap_ms = 0;
  // How long after its end a window still accepts out-of-order records, ms. Default 0.
  int64_t grace_ms = 0;
  // How long after its end a window is kept, ms; at least size + grace (sessions: gap +
  // grace). Default 24 h or that minimum if it is longer.
  int64_t retention_ms = 0;
  // Dotted path of a JSON field holding the event time (epoch ms or ISO-8601); empty:
  // the record timestamp.
  std::string time_field;
  // How far ahead of the wall clock an event time may be, ms; a record beyond it is
  // rejected and never moves stream time (beyond_max_future). >= 0. Default 24 h.
  int64_t max_future_ms = 24LL * 3600 * 1000;
};

// Fills defaults (advance of tumbling windows, retention) and checks the constraints
// above; the error names the field ("size", "advance", "inactivity_gap", "grace",
// "retention", "max_future").
status normalize(window_spec& spec);

bool is_session(const window_spec& spec) noexcept;

// Starts of every window containing `ts`, ascending (tumbling and hopping windows). Empty for a negative `ts`, which
// no epoch-aligned window with a non-negative start contains.
std::vector<int64_t> window_starts(const window_spec& spec, int64_t ts);

// The window starting at `start` no longer accepts records once stream time reaches
// end + grace.
bool window_closed(const window_spec& spec, int64_t start, int64_t stream_time) noexcept;
// The window starting at `start` is dropped once its end is at least `retention`
// older than stream time.
bool window_expired(const window_spec& spec, int64_t start, int64_t stream_time) noexcept;
// Smallest window start that is not expired at `stream_time` (everything below it may
// be deleted).
int64_t first_live_start(const window_spec& spec, int64_t stream_time) noexcept;

// Sessions. A session is [start, last]: the times of its first and last records.
// A record at `t` joins the session: start - gap <= t <= last + gap (both inclusive,
// as Kafka Streams' SessionWindows).
bool session_reaches(const window_spec& spec, int64_t start, int64_t last, int64_t t) noexcept;
// The session ending at `last` takes no more records once stream time is past
// last + gap + grace (Kafka Streams: late when last + gap + grace < stream time).
bool session_closed(const window_spec& spec, int64_t last, int64_t stream_time) noexcept;
// The session ending at `last` is dropped once last + retention < stream time: the
// half-open end (last + 1) plus retention reached, as for the other windows.
bool session_expired(const window_spec& spec, int64_t last, int64_t stream_time) noexcept;
// Smallest `last` of a session that is not expired at `stream_time`.
int64_t first_live_last(const window_spec& spec, int64_t stream_time) noexcept;

// True when event time `ts` is more than max_future_ms ahead of `now_ms` (the wall
// clock when the record is applied, ms since the epoch). Such a record would move
// stream time to its event time and close, then expire, every window before it: one
// record stamped in the year 9999 would empty the view.
bool beyond_max_future(const window_spec& spec, int64_t ts, int64_t now_ms) noexcept;

// "1m", "10s", "250ms", "24h", "7d", or a bare number of milliseconds.
result<int64_t> parse_duration_ms(std::string_view text);
// Epoch milliseconds ("1733133600000") or ISO-8601 / RFC 3339 with a zone
// ("2026-12-02T10:00:00Z", "2026-12-02T11:00:00.250+01:00").
result<int64_t> parse_timestamp_ms(std::string_view text);
// RFC 3339 in UTC with milliseconds: "2026-12-02T10:00:00.000Z". Any int64 is
// formatted to its date; a year outside 0000-9999, which RFC 3339 cannot write, gets
// ISO 8601's expanded form with a sign and six digits ("+033658-09-27T01:46:40.000Z").
std::string format_timestamp_ms(int64_t ms);

// Byte layout of a windowed key: the key, escaped so that it is order-preserving and
// prefix-free (0x00 becomes 0x00 0xff, then 0x00 0x00 ends it), followed by the start
// as 8 bytes big-endian with the sign bit flipped. Byte order of the encoded form is
// (key in byte order, then start ascending), so all windows of one key in a time range
// are one contiguous run, and keys in [from, to) map to encoded keys in
// [key_prefix(from), key_prefix(to)).
std::string encode_windowed_key(std::string_view key, int64_t start);
// The escaped key with its terminator: every window of `key` starts with it.
std::string windowed_key_prefix(std::string_view key);

struct windowed_key {
  std::string key;
  int64_t start = 0;
};
// nullopt when `bytes` is not an encoded windowed key.
std::optional<windowed_key> decode_windowed_key(std::string_view bytes);

}  // namespace kstate
