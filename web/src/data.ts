// What the pages know about the cluster: GET /v1/cluster, the stores from /v1/stores,
// readiness from /readyz.

import { cluster, listStores, readiness, type ClusterPartition, type Readiness, type Store } from './api';

export interface InstanceView {
  endpoint: string;
  self: boolean;
  ready: boolean | null; // null: the instance did not answer
  version: string | null;
  partitions: { topic: string; partition: number }[];
}

export interface ClusterView {
  group: string;
  generation: number;
  instances: InstanceView[];
  partitions: ClusterPartition[]; // per-partition owners and lag, whole group
  stores: Store[];
  servedBy: string;
  // This instance's GET /readyz, and the partition counts taken from it: exactly the
  // partitions /readyz weighs (store topics and the source topics of re-keyed
  // aggregates), so the figure and /readyz's verdict never disagree. /v1/cluster is no
  // source for this: it reports no readiness for those source topics.
  readiness: Readiness;
  readyPartitions: number;
  totalPartitions: number;
  readyInstances: number; // instances whose own readiness (their /readyz verdict) is true
}

export async function loadClusterView(): Promise<ClusterView> {
  const [c, s, r] = await Promise.all([cluster(), listStores(), readiness()]);
  const fromReadiness = {
    readiness: r,
    readyPartitions: r.partitions.filter((p) => p.ready).length,
    totalPartitions: r.partitions.length,
  };
  return {
    group: c.group,
    generation: c.membership_version,
    instances: c.instances.map((i) => ({ ...i, version: i.version ?? null })),
    partitions: c.partitions,
    stores: s.data,
    servedBy: c.served_by,
    ...fromReadiness,
    readyInstances: c.instances.filter((i) => i.ready === true).length,
  };
}

// Sum of lag over a topic's partitions; null when unknown.
export function topicLag(v: ClusterView | undefined, topic: string): number | null {
  if (!v) return null;
  let sum = 0;
  let any = false;
  for (const p of v.partitions) {
    if (p.topic !== topic || p.lag === null || p.lag === undefined) continue;
    sum += p.lag;
    any = true;
  }
  return any ? sum : null;
}
