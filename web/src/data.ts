// What the pages know about the cluster: GET /v1/cluster when this kstate has it,
// otherwise this instance alone (its /readyz and /v1/stores).

import { cluster, listStores, readiness, type ClusterPartition, type Store } from './api';

export interface InstanceView {
  endpoint: string;
  self: boolean;
  ready: boolean | null; // null: the instance did not answer
  version: string | null;
  partitions: { topic: string; partition: number }[];
}

export interface ClusterView {
  source: 'cluster' | 'local';
  group: string | null;
  generation: number | null;
  instances: InstanceView[];
  partitions: ClusterPartition[] | null; // per-partition owners and lag: cluster only
  stores: Store[];
  servedBy: string;
  readyPartitions: number; // partitions restored, of `totalPartitions`
  totalPartitions: number; // in the group (cluster) or assigned here (local)
}

export async function loadClusterView(): Promise<ClusterView> {
  const [c, s] = await Promise.all([cluster(), listStores()]);
  if (c) {
    return {
      source: 'cluster',
      group: c.group,
      generation: c.membership_version,
      instances: c.instances.map((i) => ({ ...i, version: i.version ?? null })),
      partitions: c.partitions,
      stores: s.data,
      servedBy: c.served_by,
      readyPartitions: c.partitions.filter((p) => p.ready).length,
      totalPartitions: c.partitions.length,
    };
  }
  const r = await readiness();
  return {
    source: 'local',
    group: null,
    generation: null,
    instances: [{ endpoint: s.served_by, self: true, ready: r.ready, version: null, partitions: r.partitions }],
    partitions: null,
    stores: s.data,
    servedBy: s.served_by,
    readyPartitions: r.partitions.filter((p) => p.ready).length,
    totalPartitions: r.partitions.length,
  };
}

// Sum of lag over a topic's partitions; null when unknown.
export function topicLag(v: ClusterView | undefined, topic: string): number | null {
  if (!v?.partitions) return null;
  let sum = 0;
  let any = false;
  for (const p of v.partitions) {
    if (p.topic !== topic || p.lag === null || p.lag === undefined) continue;
    sum += p.lag;
    any = true;
  }
  return any ? sum : null;
}
