// A live line chart (uPlot). Colors come from the page's CSS variables, so the chart
// follows the light or dark scheme; it is rebuilt when the scheme or series change.

import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

import { useDark } from './hooks';
import * as fmt from './format';

const clock = (t: number) =>
  new Date(t * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });

function lastOf(u: uPlot, sidx: number, idx: number | null | undefined): number | null {
  const col = u.data[sidx];
  if (!col || col.length === 0) return null;
  const v = col[idx ?? col.length - 1];
  return v === undefined || v === null ? null : v;
}

export interface SeriesDef {
  label: string;
  color: string; // a CSS variable name, e.g. "--c-accent"
  axis: 'left' | 'right';
  unit?: string;
}

export function LiveChart({ series, data, height = 220 }: { series: SeriesDef[]; data: (number | null)[][]; height?: number }) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const dark = useDark();
  const shape = series.map((s) => `${s.label}:${s.axis}`).join('|');

  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const css = getComputedStyle(el);
    const v = (name: string) => css.getPropertyValue(name).trim() || '#888';
    const grid = { stroke: v('--c-grid'), width: 1 };
    const axisBase = { stroke: v('--c-muted'), grid, ticks: { stroke: v('--c-grid'), width: 1 }, font: '11px system-ui, sans-serif' };
    const hasRight = series.some((s) => s.axis === 'right');
    const opts: uPlot.Options = {
      width: Math.max(200, el.clientWidth),
      height,
      cursor: { drag: { x: false, y: false } },
      legend: { show: true, live: true },
      scales: { x: { time: true }, left: { range: (_u, _min, max) => [0, Math.max(1, max * 1.15)] }, right: { range: (_u, _min, max) => [0, Math.max(1, max * 1.15)] } },
      axes: [
        {
          ...axisBase,
          space: 80,
          // Whole seconds and up: samples come every 2 s.
          incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600],
          values: (_u, ticks) => ticks.map((t) => clock(t)),
        },
        { ...axisBase, scale: 'left', size: 56, values: (_u, ticks) => ticks.map((t) => fmt.rate(t)) },
        ...(hasRight ? [{ ...axisBase, scale: 'right', side: 1 as const, size: 56, grid: { show: false }, values: (_u: uPlot, ticks: number[]) => ticks.map((t) => fmt.rate(t)) }] : []),
      ],
      series: [
        { label: 'time', value: (u, _t, _s, idx) => (lastOf(u, 0, idx) === null ? '—' : clock(lastOf(u, 0, idx)!)) },
        ...series.map((s) => ({
          label: s.label,
          scale: s.axis,
          stroke: v(s.color),
          width: 2,
          fill: v(s.color) + '1a',
          points: { show: false },
          // The hovered point, or the latest one while the cursor is elsewhere.
          value: (u: uPlot, _x: number | null, sidx: number, idx: number | null) => {
            const x = lastOf(u, sidx, idx);
            return x === null ? '—' : `${fmt.rate(x)}${s.unit ? ' ' + s.unit : ''}`;
          },
        })),
      ],
    };
    const u = new uPlot(opts, data as uPlot.AlignedData, el);
    plot.current = u;
    const ro = new ResizeObserver(() => u.setSize({ width: Math.max(200, el.clientWidth), height }));
    ro.observe(el);
    return () => {
      ro.disconnect();
      u.destroy();
      plot.current = null;
    };
  }, [dark, shape, height]);

  useEffect(() => {
    plot.current?.setData(data as uPlot.AlignedData);
  }, [data]);

  return <div class="chart" ref={box} />;
}
