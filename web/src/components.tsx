import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';

import type { ApiError } from './api';
import * as fmt from './format';

// An API failure as a person reads it: what, why, and the code to search for.
export function ProblemView({ error, context }: { error: ApiError; context?: string }) {
  const p = error.problem;
  return (
    <div class="problem" role="alert">
      <div class="problem-head">
        <span class="problem-icon" aria-hidden="true">!</span>
        <strong>{context ? `${context}: ` : ''}{error.title}</strong>
        {error.errorCode !== null && <code class="problem-code">error_code {error.errorCode}</code>}
        {error.status > 0 && <code class="problem-code">HTTP {error.status}</code>}
      </div>
      <p class="problem-detail">{error.detail}</p>
      {p?.instance && <p class="problem-meta">at <code>{String(p.instance)}</code></p>}
    </div>
  );
}

export function Notice({ tone = 'info', children }: { tone?: 'info' | 'warn'; children: ComponentChildren }) {
  return <div class={`notice notice-${tone}`}>{children}</div>;
}

export function Loading({ what }: { what: string }) {
  return (
    <div class="loading" aria-busy="true">
      <span class="spinner" aria-hidden="true" /> Loading {what}…
    </div>
  );
}

export type Tone = 'ok' | 'warn' | 'bad' | 'muted' | 'info';

export function Pill({ tone, children, title }: { tone: Tone; children: ComponentChildren; title?: string }) {
  return (
    <span class={`pill pill-${tone}`} title={title}>
      <span class="dot" aria-hidden="true" />
      {children}
    </span>
  );
}

export function Card({
  title,
  actions,
  children,
  class: cls,
  id,
}: {
  title?: ComponentChildren;
  actions?: ComponentChildren;
  children: ComponentChildren;
  class?: string;
  id?: string;
}) {
  return (
    <section class={`card ${cls ?? ''}`} id={id}>
      {(title || actions) && (
        <header class="card-head">
          {title && <h2>{title}</h2>}
          {actions && <div class="card-actions">{actions}</div>}
        </header>
      )}
      {children}
    </section>
  );
}

export function Stat({ label, value, sub, tone, testId }: { label: string; value: ComponentChildren; sub?: ComponentChildren; tone?: Tone; testId?: string }) {
  return (
    <div class={`stat ${tone ? `stat-${tone}` : ''}`} data-testid={testId}>
      <div class="stat-label">{label}</div>
      <div class="stat-value">{value}</div>
      {sub && <div class="stat-sub">{sub}</div>}
    </div>
  );
}

export function Progress({ done, total }: { done: number; total: number }) {
  const pct = total > 0 ? Math.round((done / total) * 100) : 0;
  const tone = total === 0 ? 'muted' : done === total ? 'ok' : 'warn';
  return (
    <div class="progress" title={`${done} of ${total} assigned partitions restored`}>
      <div class="progress-bar">
        <div class={`progress-fill progress-${tone}`} style={{ width: `${total ? pct : 0}%` }} />
      </div>
      <span class="progress-text">{total ? `${done}/${total}` : 'none assigned'}</span>
    </div>
  );
}

// Which instance answered and the position the answer reflects (invariant 3).
export function Served({ by, position, extra }: { by?: string; position?: Record<string, number> | null; extra?: ComponentChildren }) {
  return (
    <div class="served">
      {extra}
      {by && (
        <span>
          served by <code>{by}</code>
        </span>
      )}
      {position && (
        <span title="partition:next offset the answer reflects">
          position <code>{fmt.position(position)}</code>
        </span>
      )}
    </div>
  );
}

// JSON with syntax colors, built as elements (never as HTML), pretty or on one line.
export function Json({ value, pretty = true }: { value: unknown; pretty?: boolean }) {
  return <code class={`json ${pretty ? 'json-pretty' : 'json-inline'}`}>{render(value, pretty, 0)}</code>;
}

function render(v: unknown, pretty: boolean, depth: number): ComponentChildren {
  const nl = pretty ? '\n' + '  '.repeat(depth + 1) : '';
  const close = pretty ? '\n' + '  '.repeat(depth) : '';
  const sep = pretty ? ',' : ', ';
  if (v === null) return <span class="j-null">null</span>;
  if (typeof v === 'string') return <span class="j-str">{JSON.stringify(v)}</span>;
  if (typeof v === 'number') return <span class="j-num">{String(v)}</span>;
  if (typeof v === 'boolean') return <span class="j-bool">{String(v)}</span>;
  if (Array.isArray(v)) {
    if (v.length === 0) return '[]';
    return (
      <>
        [
        {v.map((x, i) => (
          <>
            {nl}
            {render(x, pretty, depth + 1)}
            {i < v.length - 1 ? sep : ''}
          </>
        ))}
        {close}]
      </>
    );
  }
  if (typeof v === 'object') {
    const entries = Object.entries(v as Record<string, unknown>);
    if (entries.length === 0) return '{}';
    return (
      <>
        {'{'}
        {entries.map(([k, x], i) => (
          <>
            {nl}
            <span class="j-key">{JSON.stringify(k)}</span>: {render(x, pretty, depth + 1)}
            {i < entries.length - 1 ? sep : ''}
          </>
        ))}
        {close}
        {'}'}
      </>
    );
  }
  // Nothing JSON.parse returns gets here; a caller's undefined or bigint still shows.
  return typeof v === 'bigint' ? v.toString() : v === undefined ? 'undefined' : `(${typeof v})`;
}

// A key as shown by the API: strings as they are, anything else (json keys) as JSON.
export function KeyText({ k }: { k: unknown }) {
  return <span class="key">{typeof k === 'string' ? k : JSON.stringify(k)}</span>;
}

export function CopyButton({ text, label = 'Copy' }: { text: string; label?: string }) {
  const [done, setDone] = useState(false);
  return (
    <button
      type="button"
      class="btn btn-ghost btn-small"
      onClick={() => {
        navigator.clipboard.writeText(text).then(
          () => {
            setDone(true);
            setTimeout(() => setDone(false), 1200);
          },
          () => {
            // clipboard refused (insecure context): nothing to do
          },
        );
      }}
    >
      {done ? 'Copied' : label}
    </button>
  );
}

export function PageHead({ title, sub, actions }: { title: ComponentChildren; sub?: ComponentChildren; actions?: ComponentChildren }) {
  return (
    <div class="page-head">
      <div>
        <h1>{title}</h1>
        {sub && <p class="page-sub">{sub}</p>}
      </div>
      {actions && <div class="page-actions">{actions}</div>}
    </div>
  );
}
