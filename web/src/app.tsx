import { readiness } from './api';
import { Pill } from './components';
import { href, usePoll, useRoute } from './hooks';
import { Browse } from './pages/browse';
import { Overview } from './pages/overview';
import { StoreDetail } from './pages/store';
import { Stores } from './pages/stores';

const NAV = [
  { id: 'overview', label: 'Overview', to: '#/' },
  { id: 'stores', label: 'Stores', to: href('stores') },
  { id: 'browse', label: 'Data', to: href('browse') },
] as const;

export function App() {
  const route = useRoute();
  const [page = 'overview', arg] = route.parts;
  const ready = usePoll(readiness, 5000);

  let body;
  let active: string = page;
  if (page === 'stores' && arg) body = <StoreDetail store={arg} />;
  else if (page === 'stores') body = <Stores />;
  else if (page === 'browse') body = <Browse store={arg} query={route.query} />;
  else {
    active = 'overview';
    body = <Overview />;
  }

  const status = ready.error ? (
    <Pill tone="bad" title={ready.error.detail}>unreachable</Pill>
  ) : ready.data ? (
    ready.data.draining ? (
      <Pill tone="warn">draining</Pill>
    ) : ready.data.ready ? (
      <Pill tone="ok">ready</Pill>
    ) : (
      <Pill tone="warn">restoring</Pill>
    )
  ) : (
    <Pill tone="muted">…</Pill>
  );

  return (
    <div class="shell">
      <header class="topbar">
        <div class="topbar-inner">
          <a class="brand" href="#/">
            <svg viewBox="0 0 32 32" width="22" height="22" aria-hidden="true">
              <rect width="32" height="32" rx="7" fill="currentColor" />
              <rect x="7" y="8" width="18" height="4" rx="1.5" fill="var(--c-topbar)" />
              <rect x="7" y="14" width="12" height="4" rx="1.5" fill="var(--c-topbar)" opacity=".85" />
              <rect x="7" y="20" width="15" height="4" rx="1.5" fill="var(--c-topbar)" opacity=".7" />
            </svg>
            kstate
          </a>
          <nav class="nav" aria-label="Pages">
            {NAV.map((n) => (
              <a href={n.to} class={active === n.id ? 'active' : ''} aria-current={active === n.id ? 'page' : undefined}>
                {n.label}
              </a>
            ))}
          </nav>
          <div class="topbar-end">
            <span class="instance-status">{status}</span>
            <a class="toplink" href="/openapi.json" target="_blank" rel="noopener">API spec</a>
            <a class="toplink" href="/metrics" target="_blank" rel="noopener">Metrics</a>
          </div>
        </div>
      </header>
      <main class="content">{body}</main>
      <footer class="footer">
        kstate dashboard · <a href="/openapi.json">/openapi.json</a> · <a href="/metrics">/metrics</a> ·{' '}
        <a href="/readyz">/readyz</a>
      </footer>
    </div>
  );
}
