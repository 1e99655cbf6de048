#include "ingest/aggregation.h"

#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <nlohmann/json.hpp>

#include "core/json_check.h"
#include "json_path.h"
#include "core/utf8.h"

namespace kstate::ingest {
namespace {

using json = nlohmann::json;

// The word scanner's table, one entry per byte: the lower-case form of an ASCII word
// character (exactly the ASCII members of \p{L}, \p{N}, \p{M} and \p{Pc}: letters,
// digits, '_'), 0 for any other ASCII byte (a separator), and `multi_byte` for a byte
// >= 0x80, which starts (or breaks) a multi-byte sequence that ICU decodes and
// classifies. One lookup per byte both classifies and lower-cases ASCII text, which
// never reaches ICU.
constexpr uint8_t multi_byte = 0x80;
constexpr std::array<uint8_t, 256> ascii_fold_table() {
  std::array<uint8_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    if (c >= 0x80) t[c] = multi_byte;
    else if (c >= 'A' && c <= 'Z') t[c] = static_cast<uint8_t>(c - 'A' + 'a');
    else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') t[c] = static_cast<uint8_t>(c);
  }
  return t;
}
constexpr std::array<uint8_t, 256> ascii_fold = ascii_fold_table();
// An ascii_fold entry of an ASCII word character: 1..0x7f.
constexpr bool ascii_word(uint8_t folded) { return static_cast<uint8_t>(folded - 1) < 0x7f; }

// A code point that belongs to a word: a letter, digit (any number), mark or connector
// punctuation, by its Unicode general category.
bool word_code_point(UChar32 c) {
  return (U_GET_GC_MASK(c) & (U_GC_L_MASK | U_GC_N_MASK | U_GC_M_MASK | U_GC_PC_MASK)) != 0;
}

// `word` (well-formed UTF-8) lower-cased with ICU's full lower-case mapping in the
// root locale (locale-independent), which also applies the final-sigma rule at the
// word's end.
std::string lower_case(std::string_view word) {
  std::string lower;
  lower.reserve(word.size());
  icu::StringByteSink<std::string> sink(&lower);
  UErrorCode err = U_ZERO_ERROR;
  icu::CaseMap::utf8ToLower("", 0, icu::StringPiece(word.data(), static_cast<int32_t>(word.size())), sink, nullptr,
                            err);
  // ICU fails only on arguments it cannot take or on memory exhaustion, not on text:
  // keep the word as written rather than lose it.
  if (U_FAILURE(err)) lower.assign(word);
  return lower;
}

std::string too_deep(const char* what, int max_json_depth) {
  return std::string(what) + " is nested deeper than max_json_depth (" + std::to_string(max_json_depth) + ")";
}

// Parses a record's JSON text after check_json() found it valid and within
// `max_json_depth`, so that nothing nested deeper ever becomes a json value (copying
// and dump() recurse per level). Returns the verdict; `out` is set on ok.
json_verdict parse_json(std::string_view text, int max_json_depth, json& out) {
  auto v = check_json(text, max_json_depth);
  if (v != json_verdict::ok) return v;
  out = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  // check_json accepts exactly what nlohmann accepts; this only guards that promise.
  return out.is_discarded() ? json_verdict::invalid : json_verdict::ok;
}

// The number a view aggregates from a value: the value itself, or the field at
// value_path of a JSON value.
std::optional<json> number_of(const view_def& v, std::optional<std::string_view> value, int max_json_depth,
                              std::string& why) {
  if (!value) {
    why = "null value: nothing to aggregate";
    return std::nullopt;
  }
  json doc;
  switch (parse_json(*value, max_json_depth, doc)) {
    case json_verdict::ok: break;
    case json_verdict::invalid:
      why = v.value_path.empty() ? "value is not a number" : "value is not valid JSON";
      return std::nullopt;
    case json_verdict::too_deep: why = too_deep("value", max_json_depth); return std::nullopt;
  }
  const json* n = &doc;
  if (!v.value_path.empty()) {
    n = json_at_path(doc, v.value_path);
    if (!n) {
      why = "value has no field '" + v.value_path + "'";
      return std::nullopt;
    }
  }
  if (!n->is_number()) {
    why = v.value_path.empty() ? "value is not a number" : "field '" + v.value_path + "' is not a number";
    return std::nullopt;
  }
  return *n;
}

// Exact while both are integers and the sum fits in 64 bits; floating point otherwise.
json add(const json& a, const json& b) {
  if (a.is_number_integer() && b.is_number_integer()) {
    int64_t x = a.get<int64_t>(), y = b.get<int64_t>(), r = 0;
    if (!__builtin_add_overflow(x, y, &r)) return r;
  }
  return a.get<double>() + b.get<double>();
}

bool less(const json& a, const json& b) {
  if (a.is_number_integer() && b.is_number_integer()) return a.get<int64_t>() < b.get<int64_t>();
  return a.get<double>() < b.get<double>();
}

bool needs_number(const view_def& v) {
  switch (v.kind) {
    case view_kind::table:
    case view_kind::join:
    case view_kind::count: return false;
    case view_kind::sum:
    case view_kind::reduce: return true;
    case view_kind::aggregate:
      for (auto f : v.fields)
        if (f != agg_field::count) return true;
      return false;
  }
  return false;
}

}  // namespace

std::vector<std::string> split_words(std::string_view line) {
  std::vector<std::string> out;
  const auto* bytes = reinterpret_cast<const uint8_t*>(line.data());
  const size_t n = line.size();
  // The current word, built as the bytes are read (one pass, like the ASCII-only
  // splitter before it): ASCII letters lower-cased on the way, other code points
  // copied and the whole word lower-cased by ICU at its end.
  std::string cur;
  size_t start = 0;   // where `cur` starts in `line`
  bool ascii = true;  // `cur` is all ASCII
  auto end_word = [&](size_t end) {
    if (cur.empty()) return;
    if (ascii) out.push_back(std::move(cur));
    else out.push_back(lower_case(line.substr(start, end - start)));
    cur.clear();
    ascii = true;
  };
  size_t i = 0;
  while (i < n) {
    uint8_t f = ascii_fold[bytes[i]];
    if (ascii_word(f)) {
      if (cur.empty()) start = i;
      do cur.push_back(static_cast<char>(f));
      while (++i < n && ascii_word(f = ascii_fold[bytes[i]]));
    } else if (f != multi_byte) {
      end_word(i);  // an ASCII separator
      ++i;
    } else {
      size_t next = i;
      UChar32 c;
      U8_NEXT(bytes, next, n, c);  // advances next; c < 0 for an ill-formed sequence
      if (c >= 0 && word_code_point(c)) {
        if (cur.empty()) start = i;
        cur.append(line.data() + i, next - i);
        ascii = false;
      } else {
        end_word(i);
      }
      i = next;
    }
  }
  end_word(n);
  return out;
}

std::string check_group_key(const view_def& view, std::string_view key, int max_json_depth) {
  if (view.key_format == data_format::json && check_json(key, max_json_depth) == json_verdict::too_deep)
    return too_deep("group key", max_json_depth);
  return {};
}

std::string group_keys(const view_def& view, std::optional<std::string_view> key, std::optional<std::string_view> value,
                       int max_json_depth, std::vector<std::string>& out) {
  switch (view.group_by) {
    case group_by_kind::key:
      if (!key) return "null key: nothing to group by";
      // A null value is nothing to aggregate, for a count as for a sum (as Kafka
      // Streams' count() skips it): a tombstone on the source is not a record to count.
      if (!value) return "null value: nothing to aggregate";
      if (auto why = check_group_key(view, *key, max_json_depth); !why.empty()) return why;
      out.emplace_back(*key);
      return {};
    case group_by_kind::words: {
      if (!value) return "null value: no words";
      if (!valid_utf8(*value)) return "value is not valid UTF-8 text: no words";
      auto words = split_words(*value);
      if (words.empty()) return "value has no words";
      for (auto& w : words) out.push_back(std::move(w));
      return {};
    }
    case group_by_kind::json: {
      if (!value) return "null value: no field '" + view.group_path + "' to group by";
      json doc;
      switch (parse_json(*value, max_json_depth, doc)) {
        case json_verdict::ok: break;
        case json_verdict::invalid: return "value is not valid JSON: no field '" + view.group_path + "' to group by";
        case json_verdict::too_deep: return too_deep("value", max_json_depth);
      }
      const json* f = json_at_path(doc, view.group_path);
      if (!f || f->is_null()) return "value has no field '" + view.group_path + "' to group by";
      std::string k = f->is_string() ? f->get<std::string>() : f->dump();
      if (auto why = check_group_key(view, k, max_json_depth); !why.empty()) return why;
      out.push_back(std::move(k));
      return {};
    }
  }
  return "unknown group_by";
}

std::string event_time(const view_def& view, std::optional<std::string_view> value, int64_t record_timestamp,
                       int max_json_depth, int64_t& out) {
  if (!view.window || view.window->time_field.empty()) {
    if (record_timestamp < 0) return "record has no timestamp";
    out = record_timestamp;
    return {};
  }
  const auto& path = view.window->time_field;
  json doc;
  const auto parsed = value ? parse_json(*value, max_json_depth, doc) : json_verdict::invalid;
  if (parsed == json_verdict::too_deep) return too_deep("value", max_json_depth);
  if (parsed != json_verdict::ok) return "value is not valid JSON: no field '" + path + "' for the event time";
  const json* f = json_at_path(doc, path);
  if (!f || f->is_null()) return "value has no field '" + path + "' for the event time";
  if (f->is_number_integer()) {
    out = f->get<int64_t>();
  } else if (f->is_string()) {
    auto t = parse_timestamp_ms(f->get_ref<const std::string&>());
    if (!t.ok()) return "field '" + path + "': " + t.error().message();
    out = t.value();
  } else {
    return "field '" + path + "' is not a timestamp (epoch ms or ISO-8601 string)";
  }
  if (out < 0) return "field '" + path + "' is before the epoch";
  return {};
}

std::string check_future(const view_def& view, int64_t ts, int64_t now_ms) {
  if (!view.window || !beyond_max_future(*view.window, ts, now_ms)) return {};
  // Printed as a date while it is one (year 9999 at most), else as epoch ms.
  constexpr int64_t year_10000 = 253'402'300'800'000;
  const std::string when = ts < year_10000 ? format_timestamp_ms(ts) : std::to_string(ts) + " ms";
  return "event time " + when + " is more than max_future (" + std::to_string(view.window->max_future_ms) +
         " ms) ahead of the clock (" + format_timestamp_ms(now_ms) + ")";
}

aggregator::aggregator(const view_def& view, int max_json_depth) : view_(view), max_json_depth_(max_json_depth) {}

std::string aggregator::check(std::optional<std::string_view> value) const {
  if (!needs_number(view_)) return {};
  std::string why;
  if (!number_of(view_, value, max_json_depth_, why)) return why;
  return {};
}

namespace {

json to_json(const agg_number& n) { return n.integer ? json(n.i) : json(n.d); }

agg_number from_json(const json& j) {
  if (j.is_number_integer() && !(j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX)))
    return {true, j.get<int64_t>(), 0};
  return {false, 0, j.get<double>()};
}

// Folds one number into a partial: its sum, min, max and latest.
void fold_number(partial_aggregate& p, const json& n) {
  p.sum = from_json(p.sum ? add(to_json(*p.sum), n) : n);
  if (!p.min || less(n, to_json(*p.min))) p.min = from_json(n);
  if (!p.max || less(to_json(*p.max), n)) p.max = from_json(n);
  p.latest = from_json(n);
}

// The partial a repartition record's value holds (after partial_marker), or why not.
std::string decode_partial(std::string_view text, int max_json_depth, bool needs_numbers, partial_aggregate& p) {
  json doc;
  if (parse_json(text, max_json_depth, doc) != json_verdict::ok || !doc.is_object())
    return "repartition record is not a partial aggregate";
  auto count = doc.find("count");
  if (count == doc.end() || !count->is_number_integer() || count->get<int64_t>() < 1)
    return "partial aggregate without a positive count";
  p.count = count->get<int64_t>();
  for (auto [name, field] : {std::pair{"sum", &p.sum}, {"min", &p.min}, {"max", &p.max}, {"latest", &p.latest}}) {
    auto it = doc.find(name);
    if (it == doc.end()) {
      if (needs_numbers) return std::string("partial aggregate without its ") + name;
      continue;
    }
    if (!it->is_number()) return std::string("partial aggregate's ") + name + " is not a number";
    *field = from_json(*it);
  }
  return {};
}

// A count stored as a plain integer, read without a JSON parser; nullopt for any other
// text (a count past 64 bits went on as a double).
std::optional<int64_t> plain_integer(std::string_view text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace

std::string aggregator::combine(partial_aggregate& p, std::optional<std::string_view> value, int64_t timestamp) const {
  if (needs_number(view_)) {
    std::string why;
    auto n = number_of(view_, value, max_json_depth_, why);
    if (!n) return why;
    fold_number(p, *n);
  }
  ++p.count;
  p.timestamp = std::max(p.timestamp, timestamp);
  return {};
}

std::string aggregator::encode(const partial_aggregate& p) const {
  json doc = json::object();
  doc["count"] = p.count;
  if (p.sum) doc["sum"] = to_json(*p.sum);
  if (p.min) doc["min"] = to_json(*p.min);
  if (p.max) doc["max"] = to_json(*p.max);
  if (p.latest) doc["latest"] = to_json(*p.latest);
  std::string out(1, partial_marker);
  out += doc.dump();
  return out;
}

aggregator::outcome aggregator::apply(std::optional<std::string_view> current,
                                      std::optional<std::string_view> value) const {
  outcome out;
  // One record is a partial of one; a combined record holds its own.
  partial_aggregate p;
  if (is_partial(value)) {
    out.error = decode_partial(value->substr(1), max_json_depth_, needs_number(view_), p);
  } else {
    out.error = combine(p, value, -1);
  }
  if (!out.error.empty()) return out;
  bool fresh = !current;
  if (view_.kind == view_kind::count) {
    // The common case of a count kept as a plain integer: no JSON parser either way.
    std::optional<int64_t> now = fresh ? std::optional<int64_t>(0) : plain_integer(*current);
    int64_t sum = 0;
    if (now && !__builtin_add_overflow(*now, p.count, &sum)) {
      out.state = std::to_string(sum);
      return out;
    }
  }
  json state;
  if (current && parse_json(*current, max_json_depth_, state) != json_verdict::ok) {
    out.error = "stored aggregate is not valid JSON";
    return out;
  }
  const json count(p.count);
  switch (view_.kind) {
    case view_kind::table: out.error = "a table is not an aggregate"; return out;
    case view_kind::join: out.error = "a join is not an aggregate"; return out;
    case view_kind::count: state = fresh ? count : add(state, count); break;
    case view_kind::sum: state = fresh ? to_json(*p.sum) : add(state, to_json(*p.sum)); break;
    case view_kind::reduce:
      switch (view_.reduce) {
        case reduce_op::latest: state = to_json(*p.latest); break;
        case reduce_op::min:
          if (fresh || less(to_json(*p.min), state)) state = to_json(*p.min);
          break;
        case reduce_op::max:
          if (fresh || less(state, to_json(*p.max))) state = to_json(*p.max);
          break;
      }
      break;
    case view_kind::aggregate: {
      json next = json::object();
      // count and sum first: mean is derived from them.
      json total = fresh ? count : add(state.value("count", json(int64_t{0})), count);
      json sum;
      if (p.sum) sum = fresh ? to_json(*p.sum) : add(state.value("sum", json(int64_t{0})), to_json(*p.sum));
      for (auto f : view_.fields) {
        switch (f) {
          case agg_field::count: next["count"] = total; break;
          case agg_field::sum: next["sum"] = sum; break;
          case agg_field::min: {
            auto it = state.is_object() ? state.find("min") : state.end();
            next["min"] = (fresh || it == state.end() || less(to_json(*p.min), *it)) ? to_json(*p.min) : *it;
            break;
          }
          case agg_field::max: {
            auto it = state.is_object() ? state.find("max") : state.end();
            next["max"] = (fresh || it == state.end() || less(*it, to_json(*p.max))) ? to_json(*p.max) : *it;
            break;
          }
          case agg_field::mean: next["mean"] = sum.get<double>() / total.get<double>(); break;
        }
      }
      state = std::move(next);
      break;
    }
  }
  out.state = state.dump();
  return out;
}

aggregator::outcome aggregator::merge(std::string_view older, std::string_view newer) const {
  outcome out;
  json a, b;
  if (parse_json(older, max_json_depth_, a) != json_verdict::ok ||
      parse_json(newer, max_json_depth_, b) != json_verdict::ok) {
    out.error = "stored aggregate is not valid JSON";
    return out;
  }
  auto number = [](const json& j) { return j.is_number(); };
  auto field = [&](const json& doc, const char* name) -> const json* {
    auto it = doc.is_object() ? doc.find(name) : doc.end();
    return it != doc.end() && number(*it) ? &*it : nullptr;
  };
  json state;
  switch (view_.kind) {
    case view_kind::table: out.error = "a table is not an aggregate"; return out;
    case view_kind::join: out.error = "a join is not an aggregate"; return out;
    case view_kind::count:
    case view_kind::sum:
      if (!number(a) || !number(b)) {
        out.error = "stored aggregate is not a number";
        return out;
      }
      state = add(a, b);
      break;
    case view_kind::reduce:
      if (!number(a) || !number(b)) {
        out.error = "stored aggregate is not a number";
        return out;
      }
      switch (view_.reduce) {
        case reduce_op::latest: state = b; break;
        case reduce_op::min: state = less(b, a) ? b : a; break;
        case reduce_op::max: state = less(a, b) ? b : a; break;
      }
      break;
    case view_kind::aggregate: {
      state = json::object();
      json total, sum;
      for (auto f : view_.fields) {
        const char* name = to_string(f);
        if (f == agg_field::mean) continue;  // derived below, from the merged count and sum
        const json* x = field(a, name);
        const json* y = field(b, name);
        if (!x || !y) {
          out.error = std::string("stored aggregate has no numeric ") + name;
          return out;
        }
        switch (f) {
          case agg_field::count: state[name] = total = add(*x, *y); break;
          case agg_field::sum: state[name] = sum = add(*x, *y); break;
          case agg_field::min: state[name] = less(*y, *x) ? *y : *x; break;
          case agg_field::max: state[name] = less(*x, *y) ? *y : *x; break;
          case agg_field::mean: break;
        }
      }
      // Rebuilt in the configured order, as apply() writes it.
      json next = json::object();
      for (auto f : view_.fields)
        next[to_string(f)] = f == agg_field::mean ? json(sum.get<double>() / total.get<double>()) : state[to_string(f)];
      state = std::move(next);
      break;
    }
  }
  out.state = state.dump();
  return out;
}

}  // namespace kstate::ingest
