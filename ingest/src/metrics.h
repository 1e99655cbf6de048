#pragma once
// Registration of the ingest module's metric families (internal to ingest): one call per
// family, so each registration site reads as a name and its help text.

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string>

namespace kstate::ingest {

inline prometheus::Family<prometheus::Counter>& counter_family(prometheus::Registry& r, const std::string& name,
                                                               const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

// A histogram without labels, with the given bucket upper bounds.
inline prometheus::Histogram& unlabelled_histogram(prometheus::Registry& r, const std::string& name,
                                                   const std::string& help,
                                                   const prometheus::Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

// A gauge without labels.
inline prometheus::Gauge& unlabelled_gauge(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

}  // namespace kstate::ingest
