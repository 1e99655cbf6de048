#include "session_fold.h"

#include <algorithm>

namespace kstate::ingest {

session_change fold_session(const aggregator& agg, const window_spec& spec, const std::vector<stored_session>& joined,
                            int64_t t, int64_t stream_time, std::optional<std::string_view> value) {
  session_change out;
  out.merged.start = t;
  out.merged.last = t;
  for (const auto& s : joined) {
    out.merged.start = std::min(out.merged.start, s.start);
    out.merged.last = std::max(out.merged.last, s.last);
  }
  if (session_closed(spec, out.merged.last, stream_time)) {
    out.late = true;
    return out;
  }
  std::optional<std::string> acc;
  for (const auto& s : joined) {
    if (!acc) {
      acc = s.state;
      continue;
    }
    auto m = agg.merge(*acc, s.state);
    if (!m.error.empty()) {
      out.error = std::move(m.error);
      return out;
    }
    acc = std::move(m.state);
  }
  auto folded = agg.apply(acc, value);
  if (!folded.error.empty()) {
    out.error = std::move(folded.error);
    return out;
  }
  out.merged.state = std::move(folded.state);
  for (const auto& s : joined)
    if (s.start != out.merged.start) out.removed.push_back(s.start);
  return out;
}

}  // namespace kstate::ingest
