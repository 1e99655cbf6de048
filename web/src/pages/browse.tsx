import { useEffect, useState } from 'preact/hooks';

import {
  ApiError,
  changesUrl,
  isWindowed,
  listStores,
  lookup,
  range,
  type Change,
  type KeyFormat,
  type LiveSelection,
  type Lookup,
  type RangePage,
  type RangeParams,
  type Store,
} from '../api';
import { Card, CopyButton, Json, KeyText, Loading, PageHead, ProblemView, Served } from '../components';
import * as fmt from '../format';
import { href, usePoll } from '../hooks';
import { describeWindow, KeyWindowsCard, WindowRangeCard } from './windows';

const FORMATS: KeyFormat[] = ['string', 'base64url', 'long', 'json'];

function defaultFormat(s: Store | undefined): KeyFormat {
  if (!s) return 'string';
  return s.key_format === 'json' ? 'json' : s.key_format === 'bytes' ? 'base64url' : 'string';
}

const asError = (e: unknown) => (e instanceof ApiError ? e : new ApiError('', 0, null, e instanceof Error ? e.message : String(e)));

export function Browse({ store, query }: { store: string | undefined; query: URLSearchParams }) {
  const stores = usePoll(listStores, 30000);
  const list = stores.data?.data ?? [];
  const current = list.find((s) => s.name === store);

  useEffect(() => {
    // No store in the URL: the first one.
    if (!store && list.length > 0) window.location.replace(href('browse', list[0]!.name));
  }, [store, list.length]);

  if (stores.loading) return <Loading what="stores" />;
  if (stores.error && !stores.data) return <ProblemView error={stores.error} context="Stores" />;
  if (list.length === 0) return <p class="empty">No stores are configured.</p>;
  if (store && !current) {
    return (
      <>
        <PageHead title="Data" />
        <ProblemView
          error={new ApiError('', 404, { type: '/problems/unknown_store', title: 'Unknown store', status: 404, detail: `no store named '${store}'`, error_code: 40401 }, '')}
        />
        <StorePicker list={list} current={undefined} />
      </>
    );
  }
  if (!current) return <Loading what="stores" />;

  return (
    <>
      <PageHead
        title="Data"
        sub={
          <>
            <code>{current.name}</code>: {current.kind} of topic <code>{current.topic}</code> · keys {current.key_format} · values {current.value_format}
            {isWindowed(current) && <> · {describeWindow(current.window)}</>}
          </>
        }
        actions={<StorePicker list={list} current={current} />}
      />
      {isWindowed(current) ? (
        // Its stored keys are (key, window) pairs: the key routes do not apply.
        <WindowCards key={`w-${current.name}`} store={current} />
      ) : (
        <div class="browse-grid">
          <LookupCard key={current.name} store={current} query={query} />
          <RangeCard key={`r-${current.name}`} store={current} />
          <LiveCard key={`l-${current.name}`} store={current} />
        </div>
      )}
    </>
  );
}

function StorePicker({ list, current }: { list: Store[]; current: Store | undefined }) {
  if (list.length < 2 && current) return null;
  return (
    <label class="field inline">
      <span>Store</span>
      <select value={current?.name ?? ''} onChange={(e) => (window.location.hash = href('browse', (e.target as HTMLSelectElement).value))}>
        {!current && <option value="">choose…</option>}
        {list.map((s) => (
          <option value={s.name}>{s.name}</option>
        ))}
      </select>
    </label>
  );
}

function FormatSelect({ value, onChange, testid }: { value: KeyFormat; onChange: (f: KeyFormat) => void; testid?: string }) {
  return (
    <label class="field narrow">
      <span>Key format</span>
      <select value={value} data-testid={testid} onChange={(e) => onChange((e.target as HTMLSelectElement).value as KeyFormat)}>
        {FORMATS.map((f) => (
          <option value={f}>{f}</option>
        ))}
      </select>
    </label>
  );
}

// ---- one key ------------------------------------------------------------------

function LookupCard({ store, query }: { store: Store; query: URLSearchParams }) {
  const [key, setKey] = useState(query.get('key') ?? '');
  const [format, setFormat] = useState<KeyFormat>((query.get('key_format') as KeyFormat | null) ?? defaultFormat(store));
  const [busy, setBusy] = useState(false);
  const [result, setResult] = useState<{ key: string; r: Lookup; ms: number } | null>(null);
  const [error, setError] = useState<ApiError | null>(null);

  const run = async (k: string, f: KeyFormat) => {
    if (!k) {
      setError(null);
      setResult(null);
      return;
    }
    setBusy(true);
    setError(null);
    const t0 = performance.now();
    try {
      const r = await lookup(store.name, k, f);
      setResult({ key: k, r, ms: performance.now() - t0 });
      // Shareable: the URL names the key (without triggering another lookup).
      history.replaceState(null, '', `${href('browse', store.name)}?${new URLSearchParams({ key: k, key_format: f })}`);
    } catch (e) {
      setResult(null);
      setError(asError(e));
    } finally {
      setBusy(false);
    }
  };

  // A link to "#/browse/<store>?key=..." looks the key up.
  const qk = query.get('key');
  const qf = query.get('key_format') as KeyFormat | null;
  useEffect(() => {
    if (qk !== null) {
      setKey(qk);
      if (qf) setFormat(qf);
      void run(qk, qf ?? format);
    }
  }, [qk, qf]);

  return (
    <Card title="Look up a key" id="lookup">
      <form
        class="form-row"
        onSubmit={(e) => {
          e.preventDefault();
          void run(key, format);
        }}
      >
        <label class="field grow">
          <span>Key</span>
          <input
            class="mono"
            data-testid="lookup-key"
            value={key}
            placeholder={format === 'long' ? 'e.g. 42' : format === 'json' ? 'e.g. {"id": 7}' : format === 'base64url' ? 'e.g. dXNlci0wMDA3' : 'e.g. user-0007'}
            onInput={(e) => setKey((e.target as HTMLInputElement).value)}
            autocomplete="off"
            spellcheck={false}
          />
        </label>
        <FormatSelect value={format} onChange={setFormat} testid="lookup-format" />
        <button class="btn btn-primary" type="submit" disabled={busy || !key} data-testid="lookup-submit">
          {busy ? 'Looking up…' : 'Look up'}
        </button>
      </form>
      {error && <ProblemView error={error} context={`Key ${JSON.stringify(key)}`} />}
      {result && result.r.found && (
        <div class="result" data-testid="lookup-result">
          <div class="result-head">
            <KeyText k={result.r.answer.key} />
            <span class="muted small">
              partition {result.r.answer.partition} · offset {fmt.int(result.r.answer.offset)} · {result.ms.toFixed(0)} ms
            </span>
            <span class="spacer" />
            <CopyButton text={JSON.stringify(result.r.answer.value, null, 2)} label="Copy value" />
          </div>
          <pre class="value" data-testid="lookup-value">
            <Json value={result.r.answer.value} />
          </pre>
          <Served by={result.r.answer.served_by} position={result.r.answer.position} />
        </div>
      )}
      {result && !result.r.found && (
        <div class="result result-missing" data-testid="lookup-missing">
          <div class="result-head">
            <strong>No value for {JSON.stringify(result.key)}</strong>
            <code class="problem-code">error_code {result.r.answer.error_code}</code>
          </div>
          <p class="muted small">
            Never written, or deleted by a tombstone, as of the position below
            {result.r.answer.partition !== undefined ? ` (partition ${result.r.answer.partition})` : ''}.
          </p>
          <Served by={result.r.answer.served_by} position={result.r.answer.position} />
        </div>
      )}
    </Card>
  );
}

// ---- a range or prefix, page by page ------------------------------------------

type Mode = 'prefix' | 'range';

interface Loaded {
  params: RangeParams; // the query every page belongs to (the cursor is valid only for it)
  pages: RangePage[];
}

function RangeCard({ store }: { store: Store }) {
  const [mode, setMode] = useState<Mode>('prefix');
  const [prefix, setPrefix] = useState('');
  const [from, setFrom] = useState('');
  const [to, setTo] = useState('');
  const [order, setOrder] = useState<'asc' | 'desc'>('asc');
  const [limit, setLimit] = useState(50);
  const [format, setFormat] = useState<KeyFormat>(defaultFormat(store));
  const [loaded, setLoaded] = useState<Loaded | null>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<ApiError | null>(null);
  const [open, setOpen] = useState<Set<string>>(new Set());

  const fetchPage = async (params: RangeParams, previous: RangePage[]) => {
    setBusy(true);
    setError(null);
    try {
      const cursor = previous.length ? previous[previous.length - 1]!.metadata.next : undefined;
      const page = await range(store.name, { ...params, ...(cursor ? { cursor } : {}) });
      setLoaded({ params, pages: [...previous, page] });
    } catch (e) {
      setError(asError(e));
    } finally {
      setBusy(false);
    }
  };

  const start = () => {
    const params: RangeParams = { order, limit, key_format: format };
    if (mode === 'prefix' && prefix) params.prefix = prefix;
    if (mode === 'range') {
      if (from) params.from = from;
      if (to) params.to = to;
    }
    setOpen(new Set());
    setLoaded(null);
    void fetchPage(params, []);
  };

  const count = loaded?.pages.reduce((n, p) => n + p.data.length, 0) ?? 0;
  const last = loaded?.pages[loaded.pages.length - 1];
  const toggle = (id: string) => {
    const n = new Set(open);
    if (n.has(id)) n.delete(id);
    else n.add(id);
    setOpen(n);
  };

  return (
    <Card title="Browse keys" id="range">
      <form
        class="range-form"
        onSubmit={(e) => {
          e.preventDefault();
          start();
        }}
      >
        <div class="segmented" role="tablist" aria-label="Browse by">
          {(['prefix', 'range'] as Mode[]).map((m) => (
            <button type="button" role="tab" aria-selected={mode === m} class={mode === m ? 'on' : ''} onClick={() => setMode(m)}>
              {m === 'prefix' ? 'Prefix' : 'Range [from, to)'}
            </button>
          ))}
        </div>
        <div class="form-row">
          {mode === 'prefix' ? (
            <label class="field grow">
              <span>Prefix</span>
              <input class="mono" data-testid="range-prefix" value={prefix} placeholder="empty: every key" onInput={(e) => setPrefix((e.target as HTMLInputElement).value)} spellcheck={false} />
            </label>
          ) : (
            <>
              <label class="field grow">
                <span>From (inclusive)</span>
                <input class="mono" data-testid="range-from" value={from} placeholder="first key" onInput={(e) => setFrom((e.target as HTMLInputElement).value)} spellcheck={false} />
              </label>
              <label class="field grow">
                <span>To (exclusive)</span>
                <input class="mono" data-testid="range-to" value={to} placeholder="end" onInput={(e) => setTo((e.target as HTMLInputElement).value)} spellcheck={false} />
              </label>
            </>
          )}
        </div>
        <div class="form-row">
          <FormatSelect value={format} onChange={setFormat} />
          <label class="field narrow">
            <span>Order</span>
            <select value={order} onChange={(e) => setOrder((e.target as HTMLSelectElement).value as 'asc' | 'desc')}>
              <option value="asc">ascending</option>
              <option value="desc">descending</option>
            </select>
          </label>
          <label class="field narrow">
            <span>Page size</span>
            <select value={limit} data-testid="range-limit" onChange={(e) => setLimit(Number((e.target as HTMLSelectElement).value))}>
              {[10, 25, 50, 100, 250, 1000].map((n) => (
                <option value={n}>{n}</option>
              ))}
            </select>
          </label>
          <button class="btn btn-primary" type="submit" disabled={busy} data-testid="range-submit">
            {busy && !loaded ? 'Loading…' : 'Browse'}
          </button>
        </div>
      </form>

      {loaded && (
        <>
          <div class="range-summary" data-testid="range-summary">
            <strong>{fmt.int(count)}</strong> {count === 1 ? 'key' : 'keys'} in {loaded.pages.length} {loaded.pages.length === 1 ? 'page' : 'pages'}
            {last && last.metadata.next === null ? <span class="tag tag-ok">end of range</span> : <span class="tag">more available</span>}
          </div>
          {count === 0 ? (
            <p class="empty">No keys in this range.</p>
          ) : (
            <div class="table-wrap">
              <table class="table kv" data-testid="range-table">
                <thead>
                  <tr>
                    <th>Key</th>
                    <th>Value</th>
                    <th class="num">Partition</th>
                    <th class="num">Offset</th>
                  </tr>
                </thead>
                {loaded.pages.map((page, pi) => (
                  <tbody>
                    {pi > 0 || loaded.pages.length > 1 ? (
                      <tr class="page-sep">
                        <td colSpan={4}>
                          <Served extra={<span>page {pi + 1} · {page.data.length} keys</span>} by={page.served_by} position={page.metadata.position} />
                        </td>
                      </tr>
                    ) : null}
                    {page.data.map((e, ri) => {
                      const id = `${pi}:${ri}`;
                      const isOpen = open.has(id);
                      return (
                        <>
                          <tr class={`kv-row ${isOpen ? 'open' : ''}`} onClick={() => toggle(id)} aria-expanded={isOpen}>
                            <td class="kv-key" data-testid="range-key">
                              <KeyText k={e.key} />
                            </td>
                            <td class="kv-value">
                              <Json value={e.value} pretty={false} />
                            </td>
                            <td class="num">{e.partition}</td>
                            <td class="num">{fmt.int(e.offset)}</td>
                          </tr>
                          {isOpen && (
                            <tr class="kv-detail">
                              <td colSpan={4}>
                                <pre class="value">
                                  <Json value={e.value} />
                                </pre>
                                <div class="kv-detail-actions">
                                  <CopyButton text={JSON.stringify(e.value, null, 2)} label="Copy value" />
                                  {typeof e.key === 'string' && (
                                    <a class="btn btn-ghost btn-small" href={`${href('browse', store.name)}?${new URLSearchParams({ key: e.key, key_format: format })}`}>
                                      Look up this key
                                    </a>
                                  )}
                                </div>
                              </td>
                            </tr>
                          )}
                        </>
                      );
                    })}
                  </tbody>
                ))}
              </table>
            </div>
          )}
          {loaded.pages.length === 1 && last && <Served by={last.served_by} position={last.metadata.position} />}
          {error && <ProblemView error={error} context="Next page" />}
          {last?.metadata.next && (
            <div class="load-more">
              <button class="btn" type="button" disabled={busy} data-testid="load-more" onClick={() => void fetchPage(loaded.params, loaded.pages)}>
                {busy ? 'Loading…' : `Load more (${loaded.params.limit ?? ''})`}
              </button>
            </div>
          )}
        </>
      )}
      {!loaded && error && <ProblemView error={error} context="Range" />}
      {!loaded && !error && !busy && <p class="hint muted small">Keys come back in byte order across all partitions; pages follow the cursor in <code>metadata.next</code>.</p>}
    </Card>
  );
}

// ---- changes as they come -------------------------------------------------------

// Changes kept on screen, newest first; current entries shown at most.
const LIVE_KEEP = 100;
const LIVE_CURRENT_MAX = 500;

type LiveState = 'connecting' | 'live' | 'reconnecting' | 'ended';
type LiveMode = LiveSelection['mode'];

// What identifies an entry: its key, and for a windowed view its window.
function entryId(c: Change): string {
  return JSON.stringify([c.key, c.start ?? null]);
}

// The test ids of a table of entries (current values) or of changes.
type ChangeIds = { table: string; row: string; key: string; value: string };
const CURRENT_IDS: ChangeIds = { table: 'live-current', row: 'live-current-row', key: 'live-current-key', value: 'live-current-value' };
const CHANGE_IDS: ChangeIds = { table: 'live-table', row: 'live-row', key: 'live-key', value: 'live-value' };

// Entries or changes of a live view: key, window (windowed stores), value (or
// "deleted"), partition, offset.
function ChangeTable({ changes, windowed, valueTitle, ids }: { changes: Change[]; windowed: boolean; valueTitle: string; ids: ChangeIds }) {
  return (
    <div class="table-wrap">
      <table class="table kv" data-testid={ids.table}>
        <thead>
          <tr>
            <th>Key</th>
            {windowed && <th>Window</th>}
            <th>{valueTitle}</th>
            <th class="num">Partition</th>
            <th class="num">Offset</th>
          </tr>
        </thead>
        <tbody>
          {changes.map((c) => (
            <tr class="kv-row" data-testid={ids.row}>
              <td class="kv-key" data-testid={ids.key}>
                <KeyText k={c.key} />
              </td>
              {windowed && (
                <td class="mono small" data-testid="live-window">
                  {c.start_time ?? ''}
                </td>
              )}
              <td class="kv-value" data-testid={ids.value}>
                {c.deleted ? <span class="tag">deleted</span> : <Json value={c.value} pretty={false} />}
              </td>
              <td class="num">{c.partition}</td>
              <td class="num">{fmt.int(c.offset)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

function LiveCard({ store }: { store: Store }) {
  const windowed = isWindowed(store);
  const [mode, setMode] = useState<LiveMode>('prefix');
  const [key, setKey] = useState('');
  const [prefix, setPrefix] = useState('');
  const [from, setFrom] = useState('');
  const [to, setTo] = useState('');
  const [snapshot, setSnapshot] = useState(false);
  const [format, setFormat] = useState<KeyFormat>(defaultFormat(store));
  const [following, setFollowing] = useState<{ sel: LiveSelection; format: KeyFormat; snapshot: boolean } | null>(null);
  const [changes, setChanges] = useState<Change[]>([]);
  // With a snapshot: the selection's current entries, kept up to date by the changes.
  const [current, setCurrent] = useState<Map<string, Change>>(new Map());
  const [seen, setSeen] = useState(0);
  const [state, setState] = useState<LiveState>('connecting');
  const [position, setPosition] = useState('');
  const [ended, setEnded] = useState<string | null>(null);

  useEffect(() => {
    if (!following) return;
    setChanges([]);
    setCurrent(new Map());
    setSeen(0);
    setEnded(null);
    setState('connecting');
    // EventSource reconnects by itself, sending the last event's id (a position), so
    // nothing is missed or shown twice across a reconnection. Snapshot events carry an
    // empty id: a reconnection before the snapshot's end takes a new snapshot.
    const es = new EventSource(changesUrl(store.name, following.sel, following.format, following.snapshot));
    let fresh = true; // the next snapshot event begins a new snapshot
    const at = (e: Event) => {
      setState('live');
      fresh = true;
      setPosition((JSON.parse((e as MessageEvent<string>).data) as { position: string }).position);
    };
    es.addEventListener('start', at);
    es.addEventListener('position', at);
    es.addEventListener('snapshot', (e) => {
      const c = JSON.parse((e as MessageEvent<string>).data) as Change;
      const begin = fresh;
      fresh = false;
      setCurrent((prev) => {
        const next = new Map(begin ? [] : prev);
        next.set(entryId(c), c);
        return next;
      });
    });
    es.addEventListener('change', (e) => {
      const c = JSON.parse((e as MessageEvent<string>).data) as Change;
      setState('live');
      fresh = true;
      setPosition(c.position);
      setSeen((n) => n + 1);
      setChanges((prev) => [c, ...prev].slice(0, LIVE_KEEP));
      setCurrent((prev) => {
        const next = new Map(prev);
        if (c.deleted) next.delete(entryId(c));
        else next.set(entryId(c), c);
        return next;
      });
    });
    es.addEventListener('error', (e) => {
      // The server's own error event (the history is gone) carries data; the browser's
      // (connection lost, or refused) does not.
      const data = (e as MessageEvent<string>).data;
      if (data) {
        setEnded((JSON.parse(data) as { detail: string }).detail);
        es.close();
        setState('ended');
      } else {
        setState(es.readyState === EventSource.CLOSED ? 'ended' : 'reconnecting');
      }
    });
    return () => es.close();
  }, [following, store.name]);

  const stateTag =
    state === 'live' ? (
      <span class="tag tag-ok">live</span>
    ) : state === 'ended' ? (
      <span class="tag">ended</span>
    ) : (
      <span class="tag">{state}…</span>
    );
  const selection = (): LiveSelection => (mode === 'key' ? { mode, key } : mode === 'prefix' ? { mode, prefix } : { mode, from, to });
  const rows = [...current.values()].slice(0, LIVE_CURRENT_MAX);

  return (
    <Card title="Changes as they come" id="live">
      <form
        class="form-row"
        onSubmit={(e) => {
          e.preventDefault();
          // What the previous subscription showed goes in the same render as the new
          // one starts: never a "live" state or rows that are not of this one.
          setState('connecting');
          setPosition('');
          setChanges([]);
          setCurrent(new Map());
          setSeen(0);
          setEnded(null);
          setFollowing({ sel: selection(), format, snapshot });
        }}
      >
        <label class="field">
          <span>Follow</span>
          <select data-testid="live-mode" value={mode} onChange={(e) => setMode((e.target as HTMLSelectElement).value as LiveMode)}>
            <option value="key">One key</option>
            <option value="prefix">A prefix</option>
            <option value="range">A range [from, to)</option>
          </select>
        </label>
        {mode === 'key' && (
          <label class="field grow">
            <span>Key</span>
            <input class="mono" data-testid="live-key-input" value={key} onInput={(e) => setKey((e.target as HTMLInputElement).value)} spellcheck={false} required />
          </label>
        )}
        {mode === 'prefix' && (
          <label class="field grow">
            <span>Prefix</span>
            <input class="mono" data-testid="live-prefix" value={prefix} placeholder="empty: every key" onInput={(e) => setPrefix((e.target as HTMLInputElement).value)} spellcheck={false} />
          </label>
        )}
        {mode === 'range' && (
          <>
            <label class="field grow">
              <span>From</span>
              <input class="mono" data-testid="live-from" value={from} placeholder="empty: the first key" onInput={(e) => setFrom((e.target as HTMLInputElement).value)} spellcheck={false} />
            </label>
            <label class="field grow">
              <span>To</span>
              <input class="mono" data-testid="live-to" value={to} placeholder="empty: past the last key" onInput={(e) => setTo((e.target as HTMLInputElement).value)} spellcheck={false} />
            </label>
          </>
        )}
        <FormatSelect value={format} onChange={setFormat} />
        <label class="field inline">
          <input type="checkbox" data-testid="live-snapshot" checked={snapshot} onChange={(e) => setSnapshot((e.target as HTMLInputElement).checked)} />
          <span>Current values first</span>
        </label>
        <button class="btn btn-primary" type="submit" data-testid="live-follow">
          {following ? 'Follow again' : 'Follow'}
        </button>
        {following && (
          <button class="btn" type="button" data-testid="live-stop" onClick={() => setFollowing(null)}>
            Stop
          </button>
        )}
      </form>
      {following ? (
        <>
          <div class="range-summary" data-testid="live-summary">
            {stateTag} <strong>{fmt.int(seen)}</strong> {seen === 1 ? 'change' : 'changes'} since following
            {position && (
              <span class="muted small">
                {' '}
                · position <code data-testid="live-position">{position}</code>
              </span>
            )}
          </div>
          {ended && <p class="problem-detail" data-testid="live-ended">{ended}</p>}
          {following.snapshot && (
            <>
              <h3 class="live-sub">
                Current values <span class="muted small">({fmt.int(current.size)}{current.size > rows.length ? `, first ${fmt.int(rows.length)} shown` : ''})</span>
              </h3>
              {rows.length === 0 ? (
                <p class="empty">No entry of the selection.</p>
              ) : (
                <ChangeTable changes={rows} windowed={windowed} valueTitle="Value" ids={CURRENT_IDS} />
              )}
              <h3 class="live-sub">Latest changes</h3>
            </>
          )}
          {changes.length === 0 ? (
            <p class="empty">No change of the selection yet; new ones appear here as they are applied.</p>
          ) : (
            <ChangeTable changes={changes} windowed={windowed} valueTitle="New value" ids={CHANGE_IDS} />
          )}
        </>
      ) : (
        <p class="hint muted small">
          Follows the store&apos;s changes from now on (Server-Sent Events from <code>/v1/stores/{store.name}/changes</code>), newest first, optionally after its current
          values; a dropped connection resumes from the last change shown.
          {store.kind !== 'table' && ' An aggregate’s changes are the updates of its changelog.'}
        </p>
      )}
    </Card>
  );
}

// ---- windowed stores ------------------------------------------------------------

function WindowCards({ store }: { store: Store & { window: NonNullable<Store['window']> } }) {
  const [format, setFormat] = useState<KeyFormat>(defaultFormat(store));
  const select = () => <FormatSelect value={format} onChange={setFormat} />;
  return (
    <div class="browse-grid">
      <KeyWindowsCard store={store} format={format} formatSelect={select} />
      <WindowRangeCard store={store} format={format} formatSelect={select} />
      <LiveCard store={store} />
    </div>
  );
}
