// Number formatting for tables and tiles.

const nf = new Intl.NumberFormat('en-US');

export function int(n: number | null | undefined): string {
  return n === null || n === undefined ? '—' : nf.format(n);
}

export function rate(n: number | null | undefined): string {
  if (n === null || n === undefined || Number.isNaN(n)) return '—';
  if (n === 0) return '0';
  if (n < 10) return n.toFixed(1);
  if (n < 10_000) return nf.format(Math.round(n));
  return compact(n);
}

export function compact(n: number): string {
  return new Intl.NumberFormat('en-US', { notation: 'compact', maximumFractionDigits: 1 }).format(n);
}

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${u === 0 ? v : v.toFixed(v < 10 ? 1 : 0)} ${units[u]}`;
}

// "0:104 1:98 …" for a position object.
export function position(p: Record<string, number> | undefined | null): string {
  if (!p) return '—';
  const parts = Object.entries(p)
    .sort((a, b) => Number(a[0]) - Number(b[0]))
    .map(([k, v]) => `${k}:${v}`);
  return parts.length ? parts.join(' ') : '—';
}

export function ago(ms: number): string {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 2 ? 'just now' : `${s}s ago`;
}

// Partitions as compact ranges: [0,1,2,3,5] -> "0–3, 5".
export function ranges(ns: number[]): string {
  const s = [...ns].sort((a, b) => a - b);
  const out: string[] = [];
  for (let i = 0; i < s.length; ) {
    let j = i;
    while (j + 1 < s.length && s[j + 1] === s[j]! + 1) j++;
    out.push(j > i + 1 ? `${s[i]}–${s[j]}` : j === i + 1 ? `${s[i]}, ${s[j]}` : `${s[i]}`);
    i = j + 1;
  }
  return out.join(', ');
}

// A duration in ms as configured: 60000 -> "1m", 90000 -> "90s", 86400000 -> "1d".
export function duration(ms: number): string {
  const units: [number, string][] = [
    [86_400_000, 'd'],
    [3_600_000, 'h'],
    [60_000, 'm'],
    [1_000, 's'],
  ];
  if (ms === 0) return '0s';
  for (const [size, unit] of units) if (ms % size === 0) return `${ms / size}${unit}`;
  return `${ms}ms`;
}
