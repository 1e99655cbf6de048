import { useEffect, useMemo, useState } from 'preact/hooks';

import { describeStore, isWindowed } from '../api';
import { LiveChart } from '../chart';
import { Card, Loading, Notice, PageHead, Pill, ProblemView, Stat } from '../components';
import { loadClusterView, topicLag } from '../data';
import * as fmt from '../format';
import { href, usePoll, useSampler } from '../hooks';
import { describeWindow } from './windows';

interface Point {
  t: number;
  lag: number | null;
  rate: number | null;
}

// Chart history per store, kept across page switches (5 minutes at 2 s).
const histories = new Map<string, Point[]>();

async function load(store: string) {
  const [details, view] = await Promise.all([describeStore(store), loadClusterView()]);
  return { details, view };
}

export function StoreDetail({ store }: { store: string }) {
  const p = usePoll(() => load(store), 2000, [store]);
  const m = useSampler();
  const d = p.data;
  const [history, setHistory] = useState<Point[]>(() => histories.get(store) ?? []);

  const topic = d?.details.topic;
  // The group's lag from the cluster view (null while no partition of the topic reports one).
  const lag = d ? topicLag(d.view, d.details.topic) : null;
  // While no lag is known, what restoring partitions still have to apply up to their
  // catch-up target.
  const backlog = d
    ? d.details.assigned_partitions.reduce((n, a) => (a.ready || a.catch_up_target < 0 ? n : n + Math.max(0, a.catch_up_target - (a.position ?? 0))), 0)
    : null;
  const lastRate = topic !== undefined ? (m.points[m.points.length - 1]?.byTopic.get(topic) ?? 0) : null;

  useEffect(() => {
    if (!d) return;
    const h = [...(histories.get(store) ?? []), { t: p.at / 1000, lag: lag ?? backlog, rate: m.error ? null : lastRate }].slice(-150);
    histories.set(store, h);
    setHistory(h);
  }, [p.at]);

  const chartData = useMemo(() => [history.map((x) => x.t), history.map((x) => x.lag), history.map((x) => x.rate)], [history]);

  if (p.loading) return <Loading what={`store ${store}`} />;
  if (!d) {
    return (
      <>
        <PageHead title={store} />
        {p.error && <ProblemView error={p.error} context={`Store ${store}`} />}
      </>
    );
  }
  const s = d.details;
  const cluster = d.view.partitions.filter((x) => x.topic === s.topic).sort((a, b) => a.partition - b.partition);
  const allReady = cluster.every((x) => x.ready);
  // Partitions this instance is catching up: how much is left, and when they should be ready.
  const catchUp = new Map(s.assigned_partitions.filter((a) => a.catch_up).map((a) => [a.partition, a.catch_up!]));

  return (
    <>
      <PageHead
        title={
          <>
            {s.name} <span class="tag tag-lg">{s.kind}</span>
          </>
        }
        sub={
          <>
            topic <code>{s.topic}</code> · {s.partitions} partitions · key {s.key_format} · value {s.value_format} · {s.partitioner}
          </>
        }
        actions={
          <a class="btn btn-primary" href={href('browse', s.name)}>
            Browse data
          </a>
        }
      />
      {p.error && <ProblemView error={p.error} context="Refresh failed; showing the last answer" />}

      <div class="stats">
        <Stat label="Estimated keys" value={fmt.int(s.estimated_keys)} sub="held by this instance" />
        <Stat label="On disk" value={fmt.bytes(s.size_on_disk_bytes)} sub={`memtables ${fmt.bytes(s.memtable_bytes)}`} />
        <Stat label="Applied / s" value={m.error ? '—' : fmt.rate(lastRate)} sub="records/s of the topic, this instance" />
        <Stat
          label={lag !== null ? 'Total lag' : 'Restore backlog'}
          value={fmt.int(lag ?? backlog)}
          sub={lag === null ? 'records to catch-up targets' : 'records behind, whole group'}
          tone={allReady ? 'ok' : 'warn'}
        />
      </div>

      <Card title={lag !== null ? 'Lag and applied records' : 'Restore backlog and applied records'} actions={<span class="muted small">every 2 s</span>}>
        {history.length < 2 ? (
          <Loading what="samples" />
        ) : (
          <LiveChart
            series={[
              { label: lag !== null ? 'lag' : 'backlog', color: '--c-warn', axis: 'left', unit: 'records' },
              { label: 'applied/s', color: '--c-accent', axis: 'right' },
            ]}
            data={chartData}
          />
        )}
      </Card>

      {isWindowed(s) && (
        <Notice>
          A windowed store ({describeWindow(s.window)}): browse its windows on the <a href={href('browse', s.name)}>data page</a>.
          {s.expired_windows !== undefined && <> {fmt.int(s.expired_windows)} expired windows deleted from this instance's disk since it started.</>}
        </Notice>
      )}

      <Card title="Partitions" class="flush">
        <div class="table-wrap">
          <table class="table cards" data-testid="partitions">
            <thead>
              <tr>
                <th class="num">Partition</th>
                <th>Owner</th>
                <th>Standbys</th>
                <th class="num">Position</th>
                <th class="num">High watermark</th>
                <th class="num">Lag</th>
                <th>Status</th>
              </tr>
            </thead>
            <tbody>
              {cluster.map((x) => (
                <tr>
                  <td data-label="Partition" class="num">{x.partition}</td>
                  <td data-label="Owner">{x.owner ? <code class="endpoint">{x.owner}</code> : <span class="muted">unassigned</span>}</td>
                  <td data-label="Standbys">{x.standbys.length ? <span>{x.standbys.map((sb: string) => <code class="endpoint block">{sb}</code>)}</span> : <span class="muted">none</span>}</td>
                  <td data-label="Position" class="num">{fmt.int(x.position)}</td>
                  <td data-label="High watermark" class="num">{fmt.int(x.high_watermark)}</td>
                  <td data-label="Lag" class={`num ${x.ready ? '' : 'warn-text'}`}>{fmt.int(x.lag)}</td>
                  <td data-label="Status">
                    {x.ready ? <Pill tone="ok">ready</Pill> : <Pill tone="warn">restoring</Pill>}
                    {!x.ready && catchUp.has(x.partition) && <CatchUpNote c={catchUp.get(x.partition)!} />}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      </Card>
    </>
  );
}

// "1,234 left · about 12 s": a partition's catch-up at its rate since the assignment.
function CatchUpNote({ c }: { c: { left: number; eta_seconds: number | null } }) {
  return (
    <span class="muted small" data-testid="catch-up">
      {' '}
      {fmt.int(c.left)} left{c.eta_seconds !== null ? ` · about ${Math.ceil(c.eta_seconds)} s` : ''}
    </span>
  );
}
