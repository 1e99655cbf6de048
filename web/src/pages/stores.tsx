import { ApiError, describeStore, type StoreDetails } from '../api';
import { Card, Loading, PageHead, ProblemView, Progress } from '../components';
import { loadClusterView, topicLag } from '../data';
import * as fmt from '../format';
import { href, usePoll } from '../hooks';

interface Row {
  name: string;
  details: StoreDetails | null;
  error: ApiError | null;
}

async function loadStores() {
  const view = await loadClusterView();
  const settled = await Promise.allSettled(view.stores.map((s) => describeStore(s.name)));
  const rows: Row[] = view.stores.map((s, i) => {
    const r = settled[i]!;
    return r.status === 'fulfilled'
      ? { name: s.name, details: r.value, error: null }
      : { name: s.name, details: null, error: r.reason instanceof ApiError ? r.reason : new ApiError('', 0, null, String(r.reason)) };
  });
  return { view, rows };
}

export function Stores() {
  const p = usePoll(loadStores, 3000);
  const d = p.data;
  return (
    <>
      <PageHead title="Stores" sub={d ? `${d.rows.length} ${d.rows.length === 1 ? 'store' : 'stores'} · as seen by ${d.view.servedBy}` : undefined} />
      {p.error && <ProblemView error={p.error} context="Stores" />}
      <Card class="flush">
        {p.loading ? (
          <Loading what="stores" />
        ) : d && d.rows.length === 0 ? (
          <p class="empty">No stores are configured. Add a view under <code>views:</code> in kstate's configuration.</p>
        ) : d ? (
          <div class="table-wrap">
            <table class="table cards" data-testid="stores">
              <thead>
                <tr>
                  <th>Store</th>
                  <th>Kind</th>
                  <th>Topic</th>
                  <th class="num">Partitions</th>
                  <th class="num">Est. keys</th>
                  <th class="num">On disk</th>
                  <th class="num">Total lag</th>
                  <th>Restore</th>
                  <th />
                </tr>
              </thead>
              <tbody>
                {d.rows.map((r) => {
                  const s = r.details ?? d.view.stores.find((x) => x.name === r.name);
                  const assigned = r.details?.assigned_partitions ?? [];
                  const lag = s ? topicLag(d.view, s.topic) : null;
                  return (
                    <tr>
                      <td data-label="Store">
                        <a class="store-name" href={href('stores', r.name)}>{r.name}</a>
                      </td>
                      <td data-label="Kind">
                        <span class="tag">{s?.kind ?? '—'}</span>
                      </td>
                      <td data-label="Topic">
                        <code>{s?.topic ?? '—'}</code>
                      </td>
                      <td data-label="Partitions" class="num">{fmt.int(s?.partitions)}</td>
                      {r.error ? (
                        <td data-label="Details" colSpan={4} class="row-error" title={r.error.detail}>
                          {r.error.title}
                          {r.error.errorCode !== null ? ` (${r.error.errorCode})` : ''}: {r.error.detail}
                        </td>
                      ) : (
                        <>
                          <td data-label="Est. keys" class="num">{fmt.int(r.details?.estimated_keys)}</td>
                          <td data-label="On disk" class="num">{fmt.bytes(r.details?.size_on_disk_bytes)}</td>
                          <td data-label="Total lag" class="num" title={lag === null ? 'not reported' : d.view.partitions ? undefined : 'partitions held by this instance'}>
                            {lag === null ? <span class="muted">—</span> : fmt.int(lag)}
                          </td>
                          <td data-label="Restore">
                            <Progress done={assigned.filter((a) => a.ready).length} total={assigned.length} />
                          </td>
                        </>
                      )}
                      <td class="actions">
                        <a class="btn btn-small" href={href('browse', r.name)}>Browse</a>
                      </td>
                    </tr>
                  );
                })}
              </tbody>
            </table>
          </div>
        ) : null}
      </Card>
      {d && !d.view.partitions && (
        <p class="muted small">
          Lag and restore progress are those of the partitions assigned to this instance: the whole group's need the cluster
          view (<code>GET /v1/cluster</code>), which this kstate does not serve yet.
        </p>
      )}
    </>
  );
}
