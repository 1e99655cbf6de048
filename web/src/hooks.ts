import { useEffect, useRef, useState } from 'preact/hooks';

import { ApiError } from './api';
import { sampler, type SamplerState } from './metrics';

export interface Polled<T> {
  data: T | undefined; // the last good answer (kept while a later poll fails)
  error: ApiError | null; // the last poll's failure, null after a success
  loading: boolean; // no answer yet
  at: number; // Date.now() of the last good answer
}

const asApiError = (e: unknown) => (e instanceof ApiError ? e : new ApiError('', 0, null, e instanceof Error ? e.message : String(e)));

// Calls `fn` now and every `ms` (while the tab is visible); re-runs when `deps` change.
export function usePoll<T>(fn: () => Promise<T>, ms: number, deps: unknown[] = []): Polled<T> {
  const [state, setState] = useState<Polled<T>>({ data: undefined, error: null, loading: true, at: 0 });
  const fnRef = useRef(fn);
  fnRef.current = fn;
  useEffect(() => {
    let alive = true;
    let timer: number | undefined;
    setState({ data: undefined, error: null, loading: true, at: 0 });
    const tick = async () => {
      if (!document.hidden) {
        try {
          const data = await fnRef.current();
          if (alive) setState({ data, error: null, loading: false, at: Date.now() });
        } catch (e) {
          if (alive) setState((s) => ({ ...s, error: asApiError(e), loading: false }));
        }
      }
      if (alive) timer = window.setTimeout(tick, ms);
    };
    void tick();
    return () => {
      alive = false;
      window.clearTimeout(timer);
    };
  }, deps);
  return state;
}

export function useSampler(): SamplerState {
  const [s, setS] = useState<SamplerState>({ points: [], error: null, latest: null });
  useEffect(() => sampler.subscribe(setS), []);
  return s;
}

// Hash routing: "#/stores/users?x=1" -> { parts: ["stores", "users"], query }.
export interface Route {
  parts: string[];
  query: URLSearchParams;
}

function parseHash(): Route {
  const h = window.location.hash.replace(/^#\/?/, '');
  const [path = '', q = ''] = h.split('?', 2);
  return { parts: path.split('/').filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(q) };
}

export function useRoute(): Route {
  const [r, setR] = useState(parseHash);
  useEffect(() => {
    const on = () => setR(parseHash());
    window.addEventListener('hashchange', on);
    return () => window.removeEventListener('hashchange', on);
  }, []);
  return r;
}

export function href(...parts: string[]): string {
  return '#/' + parts.map(encodeURIComponent).join('/');
}

// true while the page is in the dark color scheme (follows the system setting live).
export function useDark(): boolean {
  const q = typeof window !== 'undefined' ? window.matchMedia('(prefers-color-scheme: dark)') : null;
  const [dark, setDark] = useState(q?.matches ?? false);
  useEffect(() => {
    if (!q) return;
    const on = () => setDark(q.matches);
    q.addEventListener('change', on);
    return () => q.removeEventListener('change', on);
  }, []);
  return dark;
}
