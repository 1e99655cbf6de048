// Rates from kstate's Prometheus counters: /metrics is polled every 2 s and each
// counter is differenced against the previous sample. One sampler serves every page,
// so switching pages keeps the history of the charts.

import { ApiError, metricsText } from './api';

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

// Parses the Prometheus text exposition format (comments skipped, label values
// unescaped). Lines that do not parse are ignored rather than failing the page.
export function parsePrometheus(text: string): Sample[] {
  const out: Sample[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    let i = 0;
    while (i < line.length && /[A-Za-z0-9_:]/.test(line[i]!)) i++;
    const name = line.slice(0, i);
    if (!name) continue;
    const labels: Record<string, string> = {};
    if (line[i] === '{') {
      i++;
      while (i < line.length && line[i] !== '}') {
        const eq = line.indexOf('=', i);
        if (eq < 0 || line[eq + 1] !== '"') break;
        const key = line.slice(i, eq).trim();
        let j = eq + 2;
        let val = '';
        while (j < line.length && line[j] !== '"') {
          if (line[j] === '\\' && j + 1 < line.length) {
            const n = line[j + 1];
            val += n === 'n' ? '\n' : n;
            j += 2;
          } else {
            val += line[j];
            j++;
          }
        }
        labels[key] = val;
        i = j + 1;
        if (line[i] === ',') i++;
      }
      i++; // '}'
    }
    const rest = line.slice(i).trim().split(/\s+/);
    const value = Number(rest[0]);
    if (rest[0] === undefined || Number.isNaN(value)) continue;
    out.push({ name, labels, value });
  }
  return out;
}

export const LOOKUP_ROUTE = '/v1/stores/{store}/keys/{key}';

// The counters the dashboard derives rates from.
export interface Counters {
  consumed: Map<string, number>; // "topic/partition" -> records consumed
  lookups: number; // key lookups answered (any status)
  requests: number; // every API request
}

export function counters(samples: Sample[]): Counters {
  const consumed = new Map<string, number>();
  let lookups = 0;
  let requests = 0;
  for (const s of samples) {
    if (s.name === 'kstate_ingest_records_consumed_total') {
      const k = `${s.labels.topic ?? ''}/${s.labels.partition ?? ''}`;
      consumed.set(k, (consumed.get(k) ?? 0) + s.value);
    } else if (s.name === 'kstate_http_request_duration_seconds_count') {
      requests += s.value;
      if (s.labels.route === LOOKUP_ROUTE) lookups += s.value;
    }
  }
  return { consumed, lookups, requests };
}

export interface RatePoint {
  t: number; // seconds since the epoch
  records: number; // records applied per second, all topics
  lookups: number; // key lookups per second
  byTopic: Map<string, number>;
  byPartition: Map<string, number>; // "topic/partition"
}

// A counter's increase per second; a counter that went down was reset (restart): 0.
const rate = (now: number, before: number | undefined, dt: number) =>
  before === undefined || now < before ? 0 : (now - before) / dt;

export function ratesBetween(a: Counters, b: Counters, dt: number, t: number): RatePoint {
  const byTopic = new Map<string, number>();
  const byPartition = new Map<string, number>();
  let records = 0;
  for (const [k, v] of b.consumed) {
    const r = rate(v, a.consumed.get(k), dt);
    byPartition.set(k, r);
    const topic = k.slice(0, k.lastIndexOf('/'));
    byTopic.set(topic, (byTopic.get(topic) ?? 0) + r);
    records += r;
  }
  return { t, records, lookups: rate(b.lookups, a.lookups, dt), byTopic, byPartition };
}

export interface SamplerState {
  points: RatePoint[];
  error: ApiError | null;
  latest: Counters | null;
}

const HISTORY = 150; // 5 minutes at one sample per 2 s

class Sampler {
  private state: SamplerState = { points: [], error: null, latest: null };
  private last: { c: Counters; at: number } | null = null;
  private listeners = new Set<(s: SamplerState) => void>();
  private timer: number | undefined;

  subscribe(fn: (s: SamplerState) => void): () => void {
    this.listeners.add(fn);
    fn(this.state);
    if (this.listeners.size === 1) this.start();
    return () => {
      this.listeners.delete(fn);
      if (this.listeners.size === 0) this.stop();
    };
  }

  private start() {
    const tick = async () => {
      if (!document.hidden) await this.sample();
      this.timer = window.setTimeout(tick, 2000);
    };
    void tick();
  }

  private stop() {
    window.clearTimeout(this.timer);
    this.timer = undefined;
  }

  private async sample() {
    try {
      const c = counters(parsePrometheus(await metricsText()));
      const at = performance.now();
      let points = this.state.points;
      if (this.last) {
        const dt = (at - this.last.at) / 1000;
        if (dt > 0.2) points = [...points, ratesBetween(this.last.c, c, dt, Date.now() / 1000)].slice(-HISTORY);
      }
      this.last = { c, at };
      this.state = { points, error: null, latest: c };
    } catch (e) {
      this.state = { ...this.state, error: e instanceof ApiError ? e : new ApiError('/metrics', 0, null, String(e)) };
    }
    for (const l of this.listeners) l(this.state);
  }
}

export const sampler = new Sampler();
