// The data page of a windowed store: the windows of one key, and the windows of a key
// range across the cluster, page by page. Values are drawn as bars scaled to the
// largest number shown, so "clicks per minute" reads as a histogram.

import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';

import {
  ApiError,
  keyWindows,
  windowRange,
  type KeyFormat,
  type KeyWindows,
  type Store,
  type WindowDef,
  type WindowPage,
  type WindowParams,
} from '../api';
import { Card, Json, KeyText, ProblemView, Served } from '../components';
import * as fmt from '../format';

const asError = (e: unknown) => (e instanceof ApiError ? e : new ApiError('', 0, null, e instanceof Error ? e.message : String(e)));

// "2026-12-02T10:01:00.000Z" -> "2026-12-02 10:01:00" (UTC, milliseconds only when set).
export function utc(iso: string): string {
  return iso.replace('T', ' ').replace(/\.000Z$/, '').replace(/Z$/, '');
}

// "1m tumbling windows, grace 30s, kept 24h"; "sessions with a 30m inactivity gap, grace 5m, kept 24h"
export function describeWindow(w: WindowDef): string {
  const kind =
    w.type === 'session'
      ? `sessions with a ${fmt.duration(w.inactivity_gap_ms ?? 0)} inactivity gap`
      : w.type === 'tumbling'
        ? `${fmt.duration(w.size_ms)} tumbling windows`
        : `${fmt.duration(w.size_ms)} windows every ${fmt.duration(w.advance_ms)}`;
  return `${kind}, grace ${fmt.duration(w.grace_ms)}, kept ${fmt.duration(w.retention_ms)}`;
}

function Bar({ value, max }: { value: unknown; max: number }) {
  if (typeof value !== 'number' || max <= 0) return <Json value={value} pretty={false} />;
  const pct = Math.max(0, Math.min(100, (value / max) * 100));
  return (
    <span class="wbar">
      <span class="wbar-fill" style={{ width: `${pct}%` }} />
      <span class="wbar-num">{fmt.int(value)}</span>
    </span>
  );
}

const largest = (values: unknown[]) => values.reduce<number>((m, v) => (typeof v === 'number' && v > m ? v : m), 0);

function TimeFields({ from, to, setFrom, setTo, prefix }: { from: string; to: string; setFrom: (v: string) => void; setTo: (v: string) => void; prefix: string }) {
  return (
    <>
      <label class="field">
        <span>From (time)</span>
        <input class="mono" data-testid={`${prefix}-from`} value={from} placeholder="2026-12-02T10:00:00Z" onInput={(e) => setFrom((e.target as HTMLInputElement).value)} />
      </label>
      <label class="field">
        <span>To (time)</span>
        <input class="mono" data-testid={`${prefix}-to`} value={to} placeholder="epoch ms or ISO-8601" onInput={(e) => setTo((e.target as HTMLInputElement).value)} />
      </label>
    </>
  );
}

// ---- one key -------------------------------------------------------------------------

export function KeyWindowsCard({ store, format, formatSelect }: { store: Store & { window: WindowDef }; format: KeyFormat; formatSelect: () => ComponentChildren }) {
  const [key, setKey] = useState('');
  const [from, setFrom] = useState('');
  const [to, setTo] = useState('');
  const [busy, setBusy] = useState(false);
  const [answer, setAnswer] = useState<KeyWindows | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const max = answer ? largest(answer.data.map((w) => w.value)) : 0;
  async function show() {
    setBusy(true);
    setError(null);
    try {
      setAnswer(await keyWindows(store.name, key, format, from, to));
    } catch (err) {
      setAnswer(null);
      setError(asError(err));
    } finally {
      setBusy(false);
    }
  }
  return (
    <Card title="Windows of a key" id="windows">
      <form
        class="form-row"
        onSubmit={(e) => {
          e.preventDefault();
          void show();
        }}
      >
        <label class="field grow">
          <span>Key</span>
          <input class="mono" data-testid="kw-key" value={key} onInput={(e) => setKey((e.target as HTMLInputElement).value)} spellcheck={false} />
        </label>
        <TimeFields from={from} to={to} setFrom={setFrom} setTo={setTo} prefix="kw" />
        {formatSelect()}
        <button class="btn btn-primary" type="submit" disabled={busy || !key} data-testid="kw-submit">
          {busy ? 'Loading…' : 'Show windows'}
        </button>
      </form>
      {error && <ProblemView error={error} context="Windows" />}
      {answer && (
        <>
          {answer.data.length === 0 ? (
            <p class="empty">No window of this key overlaps the interval.</p>
          ) : (
            <div class="table-wrap">
              <table class="table" data-testid="kw-table">
                <thead>
                  <tr>
                    <th>Start (UTC)</th>
                    <th>End</th>
                    <th class="wide">Value</th>
                    <th class="num">Offset</th>
                  </tr>
                </thead>
                <tbody>
                  {answer.data.map((w) => (
                    <tr data-testid="kw-row" data-start={w.start}>
                      <td class="mono">{utc(w.start_time)}</td>
                      <td class="mono muted">{utc(w.end_time)}</td>
                      <td data-testid="kw-value" data-value={typeof w.value === 'number' ? w.value : undefined}>
                        <Bar value={w.value} max={max} />
                      </td>
                      <td class="num">{fmt.int(w.offset)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
          <Served
            extra={
              <span>
                partition {answer.partition} · stream time {answer.stream_time < 0 ? 'none yet' : <code>{utc(new Date(answer.stream_time).toISOString())}</code>}
              </span>
            }
            by={answer.served_by}
            position={answer.position}
          />
        </>
      )}
    </Card>
  );
}

// ---- a key range ---------------------------------------------------------------------

export function WindowRangeCard({ store, format, formatSelect }: { store: Store; format: KeyFormat; formatSelect: () => ComponentChildren }) {
  const [keyFrom, setKeyFrom] = useState('');
  const [keyTo, setKeyTo] = useState('');
  const [from, setFrom] = useState('');
  const [to, setTo] = useState('');
  const [limit, setLimit] = useState(100);
  const [busy, setBusy] = useState(false);
  const [loaded, setLoaded] = useState<{ params: WindowParams; pages: WindowPage[] } | null>(null);
  const [error, setError] = useState<ApiError | null>(null);

  const fetchPage = async (params: WindowParams, previous: WindowPage[]) => {
    setBusy(true);
    setError(null);
    try {
      const cursor = previous.length ? previous[previous.length - 1]!.metadata.next : undefined;
      const page = await windowRange(store.name, { ...params, ...(cursor ? { cursor } : {}) });
      setLoaded({ params, pages: [...previous, page] });
    } catch (e) {
      setError(asError(e));
    } finally {
      setBusy(false);
    }
  };

  const rows = loaded?.pages.flatMap((p) => p.data) ?? [];
  const max = largest(rows.map((w) => w.value));
  const last = loaded?.pages[loaded.pages.length - 1];

  return (
    <Card title="Windows of a key range" id="window-range">
      <form
        class="range-form"
        onSubmit={(e) => {
          e.preventDefault();
          const params: WindowParams = { limit, key_format: format };
          if (keyFrom) params.key_from = keyFrom;
          if (keyTo) params.key_to = keyTo;
          if (from) params.from = from;
          if (to) params.to = to;
          setLoaded(null);
          void fetchPage(params, []);
        }}
      >
        <div class="form-row">
          <label class="field grow">
            <span>Keys from (inclusive)</span>
            <input class="mono" data-testid="wr-key-from" value={keyFrom} placeholder="first key" onInput={(e) => setKeyFrom((e.target as HTMLInputElement).value)} spellcheck={false} />
          </label>
          <label class="field grow">
            <span>Keys to (exclusive)</span>
            <input class="mono" data-testid="wr-key-to" value={keyTo} placeholder="end" onInput={(e) => setKeyTo((e.target as HTMLInputElement).value)} spellcheck={false} />
          </label>
        </div>
        <div class="form-row">
          <TimeFields from={from} to={to} setFrom={setFrom} setTo={setTo} prefix="wr" />
          {formatSelect()}
          <label class="field narrow">
            <span>Page size</span>
            <select value={limit} data-testid="wr-limit" onChange={(e) => setLimit(Number((e.target as HTMLSelectElement).value))}>
              {[25, 100, 250, 1000].map((n) => (
                <option value={n}>{n}</option>
              ))}
            </select>
          </label>
          <button class="btn btn-primary" type="submit" disabled={busy} data-testid="wr-submit">
            {busy && !loaded ? 'Loading…' : 'Show windows'}
          </button>
        </div>
      </form>

      {loaded && (
        <>
          <div class="range-summary" data-testid="wr-summary">
            <strong>{fmt.int(rows.length)}</strong> {rows.length === 1 ? 'window' : 'windows'} in {loaded.pages.length} {loaded.pages.length === 1 ? 'page' : 'pages'}
            {last && last.metadata.next === null ? <span class="tag tag-ok">end of range</span> : <span class="tag">more available</span>}
          </div>
          {rows.length === 0 ? (
            <p class="empty">No windows in this range.</p>
          ) : (
            <div class="table-wrap">
              <table class="table" data-testid="wr-table">
                <thead>
                  <tr>
                    <th>Key</th>
                    <th>Start (UTC)</th>
                    <th class="wide">Value</th>
                    <th class="num">Partition</th>
                  </tr>
                </thead>
                <tbody>
                  {rows.map((w) => (
                    <tr data-testid="wr-row" data-start={w.start}>
                      <td class="kv-key" data-testid="wr-key">
                        <KeyText k={w.key} />
                      </td>
                      <td class="mono" title={`${utc(w.start_time)} – ${utc(w.end_time)}`}>
                        {utc(w.start_time)}
                      </td>
                      <td data-testid="wr-value" data-value={typeof w.value === 'number' ? w.value : undefined}>
                        <Bar value={w.value} max={max} />
                      </td>
                      <td class="num">{w.partition}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
          {last && <Served by={last.served_by} position={last.metadata.position} />}
          {error && <ProblemView error={error} context="Next page" />}
          {last?.metadata.next && (
            <div class="load-more">
              <button class="btn" type="button" disabled={busy} data-testid="wr-load-more" onClick={() => void fetchPage(loaded.params, loaded.pages)}>
                {busy ? 'Loading…' : `Load more (${loaded.params.limit ?? ''})`}
              </button>
            </div>
          )}
        </>
      )}
      {!loaded && error && <ProblemView error={error} context="Windows" />}
      {!loaded && !error && !busy && (
        <p class="hint muted small">
          Windows come ordered by key bytes, then by start, from every partition of the cluster; a window is listed when it overlaps the
          time interval.
        </p>
      )}
    </Card>
  );
}
