#pragma once
// Every route's handler (see routes.cc for paths and access rules).

#include "api/state.h"

namespace kstate::server::api {

// admin.cc: health, metrics, descriptions, the cluster view
outcome livez(const state&, const call&);
outcome readyz(const state&, const call&);
outcome metrics(const state&, const call&);
outcome openapi(const state&, const call&);
outcome list_stores(const state&, const call&);
outcome describe_store(const state&, const call&);
outcome cluster(const state&, const call&);

// keys.cc: one key, or a batch of keys
outcome get_key(const state&, const call&);
outcome key_metadata(const state&, const call&);
outcome key_windows(const state&, const call&);
outcome key_versions(const state&, const call&);
outcome batch_get(const state&, const call&);

// ranges.cc: ranges of keys (pages and streams), windows across keys, counts
outcome range(const state&, const call&);
outcome windows_range(const state&, const call&);
outcome count(const state&, const call&);

// changes.cc: change subscriptions of table views (SSE, NDJSON)
outcome changes(const state&, const call&);

// snapshots.cc: copies of a partition sent to another instance (internal routes)
outcome snapshot_get(const state&, const call&);
outcome snapshot_open(const state&, const call&);

// coalesce.cc: a batch of forwarded requests from another instance (internal route)
outcome internal_forwards(const state&, const call&);

}  // namespace kstate::server::api
