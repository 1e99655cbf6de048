import { Card, Loading, Pill, ProblemView, Stat, PageHead } from '../components';
import { LiveChart } from '../chart';
import { loadClusterView, type ClusterView, type InstanceView } from '../data';
import * as fmt from '../format';
import { href, usePoll, useSampler } from '../hooks';

export function Overview() {
  const view = usePoll(loadClusterView, 3000);
  const m = useSampler();
  const v = view.data;
  const last = m.points[m.points.length - 1];

  // The group's lag, from the cluster view.
  const totalLag = v ? v.partitions.reduce((n, p) => n + (p.lag ?? 0), 0) : null;

  return (
    <>
      <PageHead
        title="Overview"
        sub={
          v ? (
            <>
              Consumer group <code>{v.group}</code> · membership version {v.generation} · {v.instances.length}{' '}
              {v.instances.length === 1 ? 'instance' : 'instances'}
            </>
          ) : undefined
        }
      />
      {view.error && <ProblemView error={view.error} context="Cluster state" />}

      <div class="stats">
        <Stat label="Records applied / s" value={m.error ? '—' : fmt.rate(last?.records)} sub={m.error ? 'metrics unavailable' : 'this instance, 2 s window'} />
        <Stat label="Key lookups / s" value={m.error ? '—' : fmt.rate(last?.lookups)} sub={m.error ? 'metrics unavailable' : 'this instance, 2 s window'} />
        <Stat
          label="Partitions ready"
          value={v ? `${v.readyPartitions} / ${v.totalPartitions}` : '—'}
          sub={v ? <ReadySub v={v} /> : undefined}
          tone={v ? (v.readiness.ready ? 'ok' : 'warn') : undefined}
          testId="partitions-ready"
        />
        <Stat
          label="Total lag"
          value={totalLag === null ? '—' : fmt.int(totalLag)}
          sub={totalLag === null ? 'not reported' : 'records behind, whole group'}
        />
      </div>

      <Card title="Throughput" actions={<span class="muted small">this instance · every 2 s</span>}>
        {m.error ? (
          <ProblemView error={m.error} context="Metrics" />
        ) : m.points.length < 2 ? (
          <Loading what="rates (two samples of /metrics)" />
        ) : (
          <LiveChart
            series={[
              { label: 'records applied/s', color: '--c-accent', axis: 'left' },
              { label: 'lookups/s', color: '--c-accent2', axis: 'right' },
            ]}
            data={[m.points.map((p) => p.t), m.points.map((p) => p.records), m.points.map((p) => p.lookups)]}
          />
        )}
      </Card>

      <Card title="Instances" class="flush">
        {view.loading ? (
          <Loading what="instances" />
        ) : v ? (
          <div class="table-wrap">
            <table class="table cards" data-testid="instances">
              <thead>
                <tr>
                  <th>Instance</th>
                  <th>Status</th>
                  <th>Version</th>
                  <th>Partitions</th>
                </tr>
              </thead>
              <tbody>
                {v.instances.map((i) => (
                  <InstanceRow i={i} />
                ))}
              </tbody>
            </table>
          </div>
        ) : null}
      </Card>

      <Card title="Stores" class="flush" actions={<a href={href('stores')}>All stores →</a>}>
        {v && v.stores.length === 0 && <p class="empty">No stores are configured.</p>}
        {v && v.stores.length > 0 && (
          <ul class="store-list">
            {v.stores.map((s) => (
              <li>
                <a class="store-name" href={href('stores', s.name)}>{s.name}</a>
                <span class="muted">
                  {s.kind} of <code>{s.topic}</code> · {s.partitions} partitions · {s.key_format} → {s.value_format}
                </span>
                <a class="btn btn-small" href={href('browse', s.name)}>Browse</a>
              </li>
            ))}
          </ul>
        )}
      </Card>
    </>
  );
}

// Under the ready count: whose count it is (this instance's, as its /readyz weighs it),
// and in a group how many instances are ready by their own /readyz.
function ReadySub({ v }: { v: ClusterView }) {
  const here = v.readiness.draining ? 'assigned here · draining' : 'assigned here';
  return (
    <>
      {here} · {v.readyInstances} / {v.instances.length} {v.instances.length === 1 ? 'instance' : 'instances'} ready
    </>
  );
}

function InstanceRow({ i }: { i: InstanceView }) {
  const byTopic = new Map<string, number[]>();
  for (const p of i.partitions) byTopic.set(p.topic, [...(byTopic.get(p.topic) ?? []), p.partition]);
  return (
    <tr>
      <td data-label="Instance">
        <span>
          <code class="endpoint">{i.endpoint}</code>
          {i.self && <span class="tag">this instance</span>}
        </span>
      </td>
      <td data-label="Status">{i.ready === null ? <Pill tone="warn">no answer</Pill> : i.ready ? <Pill tone="ok">ready</Pill> : <Pill tone="warn">restoring</Pill>}</td>
      <td data-label="Version">{i.version ?? <span class="muted">—</span>}</td>
      <td data-label="Partitions">
        {byTopic.size === 0 ? (
          <span class="muted">none assigned</span>
        ) : (
          <span class="chips">
            {[...byTopic].map(([t, ps]) => (
              <span class="chip">
                <span class="chip-topic">{t}</span> {fmt.ranges(ps)}
              </span>
            ))}
          </span>
        )}
      </td>
    </tr>
  );
}
