// The dashboard in a real browser against a real kstate and a real broker.
//
// Starts what it needs: a topic on the broker of scripts/test (KSTATE_BOOTSTRAP, tools
// via scripts/kafka and KSTATE_KAFKA_RUN), demo-like records, a kstate of its own
// (KSTATE_BINARY) serving web/dist at /ui/, and Debian's chromium driven by
// playwright-core. Screenshots of every page go to KSTATE_E2E_OUTPUT.
//
//   KSTATE_BINARY=build/server/kstate KSTATE_BOOTSTRAP=127.0.0.1:9092 \
//     node --test tests/e2e/dashboard.test.mjs
//
// Missing prerequisites (chromium, the built dashboard, npm packages, the broker) fail
// the test with a message saying what to run: a dashboard test that silently passes
// without a browser would protect nothing.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const source = resolve(process.env.KSTATE_SOURCE_DIR ?? join(here, '..', '..'));
const out = resolve(process.env.KSTATE_E2E_OUTPUT ?? join(source, 'build', 'test-output', 'e2e'));
const chromiumPath = process.env.KSTATE_CHROMIUM ?? '/usr/bin/chromium';
const uiDir = join(source, 'web', 'dist');
const kafkaScript = join(source, 'scripts', 'kafka');

const DESKTOP = { width: 1366, height: 900 };
const PHONE = { width: 375, height: 812 };

// ---- the data set -----------------------------------------------------------------

const FIRST = ['Ada', 'Grace', 'Linus', 'Barbara', 'Dennis', 'Frances', 'Ken', 'Margaret', 'Edsger', 'Radia'];
const CITIES = ['Lisbon', 'Oslo', 'Nairobi', 'Kyoto', 'Montreal', 'Valparaíso', 'Tallinn', 'Auckland'];
const USERS = 240;

// key -> latest value (undefined after a tombstone), and the lines to produce.
function dataSet() {
  const lines = [];
  const latest = new Map();
  const put = (k, v) => {
    lines.push(`${k}\t${v === null ? 'NULL' : JSON.stringify(v)}`);
    if (v === null) latest.delete(k);
    else latest.set(k, v);
  };
  const user = (i, moved) => ({
    name: `${FIRST[i % FIRST.length]} ${i}`,
    city: CITIES[(i * 7 + (moved ? 3 : 0)) % CITIES.length],
    visits: ((i * 37) % 101) + (moved ? 1000 : 0),
    tags: i % 3 === 0 ? ['early', 'beta'] : [],
  });
  const key = (i) => `user-${String(i).padStart(4, '0')}`;
  for (let i = 1; i <= USERS; i++) put(key(i), user(i, false));
  put('team/alpha', { name: 'Team Alpha', members: ['user-0001', 'user-0002'] });
  put('héllo', { name: 'Héllo', city: 'Genève', visits: 1 });
  put('with space', { name: 'With Space', visits: 2 });
  for (let i = 10; i <= USERS; i += 10) put(key(i), user(i, true)); // later updates win
  put(key(50), null); // tombstones delete
  put(key(100), null);
  return { lines, latest };
}

// Clicks with event times for the windowed store: 600 clicks of 12 users, one every
// 2 s from 10:00 UTC (20 minutes), in time order. The recount: (user, minute) -> clicks.
const CLICK_BASE = Date.parse('2026-12-02T10:00:00Z');
function clickSet() {
  const lines = [];
  const perMinute = new Map();
  const hex = (s) => Buffer.from(s, 'utf8').toString('hex');
  for (let i = 0; i < 600; i++) {
    const user = `click-user-${String((i * 7) % 12).padStart(2, '0')}`;
    const ts = CLICK_BASE + i * 2000;
    lines.push(`${hex(user)}\t${hex(JSON.stringify({ page: `/p/${i % 9}` }))}\t${ts}`);
    const k = `${user}|${Math.floor(ts / 60000) * 60000}`;
    perMinute.set(k, (perMinute.get(k) ?? 0) + 1);
  }
  return { lines, perMinute };
}

// ---- helpers ------------------------------------------------------------------------

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once('error', fail);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

function kafka(args, input) {
  const r = spawnSync(kafkaScript, args, { input, encoding: 'utf8', env: process.env, timeout: 120_000 });
  if (r.status !== 0) throw new Error(`scripts/kafka ${args.join(' ')} failed (${r.status}): ${r.stderr || r.stdout}`);
  return r.stdout;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function getJson(url) {
  const res = await fetch(url);
  return { status: res.status, headers: res.headers, body: await res.json().catch(() => null) };
}

function logTail(path) {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-30).join('\n');
  } catch {
    return '(no log)';
  }
}

// ---- fixture --------------------------------------------------------------------------

const run = { topic: '', linesTopic: '', clicks: null, kstate: null, context: null, page: null, base: '', log: '', errors: [], latest: null, profile: '' };

before(async () => {
  // Prerequisites, each failing with what to do about it.
  const binary = process.env.KSTATE_BINARY;
  assert.ok(binary && existsSync(binary), `KSTATE_BINARY must name the built kstate binary (got ${binary ?? 'nothing'}); ctest sets it`);
  assert.ok(
    existsSync(chromiumPath),
    `chromium is not installed at ${chromiumPath}: run scripts/setup (installs Debian's chromium), or set KSTATE_CHROMIUM`,
  );
  assert.ok(
    existsSync(join(uiDir, 'index.html')),
    `the dashboard is not built (${uiDir}/index.html is missing): scripts/test builds it, or run npm ci && npm run build in web/`,
  );
  let chromium;
  try {
    ({ chromium } = await import('playwright-core'));
  } catch (e) {
    assert.fail(`playwright-core is not installed in tests/e2e (${e.message}): scripts/test runs npm ci there, or run it yourself`);
  }
  let bootstrap = process.env.KSTATE_BOOTSTRAP;
  if (!bootstrap) {
    const r = spawnSync(kafkaScript, ['bootstrap'], { encoding: 'utf8' });
    bootstrap = r.status === 0 ? r.stdout.trim() : '';
  }
  assert.ok(bootstrap, 'no Kafka broker: set KSTATE_BOOTSTRAP (scripts/test does) or start one with scripts/kafka start');

  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });

  // A topic of its own, loaded before kstate starts: /readyz 200 then means all of it.
  const stamp = `${Date.now()}-${process.pid}`;
  const topic = `e2e-users-${stamp}`;
  run.topic = topic;
  kafka(['topics', '--create', '--topic', topic, '--partitions', '3', '--replication-factor', '1']);
  const { lines, latest } = dataSet();
  run.latest = latest;
  kafka(
    ['console-producer', '--topic', topic, '--property', 'parse.key=true', '--property', 'key.separator=\t', '--property', 'null.marker=NULL'],
    lines.join('\n') + '\n',
  );

  const clickTopic = `e2e-clicks-${stamp}`;
  kafka(['topics', '--create', '--topic', clickTopic, '--partitions', '3', '--replication-factor', '1']);
  run.clicks = clickSet();
  kafka(['produce-bytes', '--topic', clickTopic], run.clicks.lines.join('\n') + '\n');

  // Text for a word count: a re-keyed aggregate, whose store topic (the repartition
  // topic kstate creates) is not the topic it reads. /readyz weighs both.
  const linesTopic = `e2e-lines-${stamp}`;
  run.linesTopic = linesTopic;
  kafka(['topics', '--create', '--topic', linesTopic, '--partitions', '3', '--replication-factor', '1']);
  kafka(['console-producer', '--topic', linesTopic], ['the quick brown fox', 'jumps over the lazy dog', 'the end'].join('\n') + '\n');

  const port = await freePort();
  run.base = `http://127.0.0.1:${port}`;
  const config = join(out, 'kstate.yaml');
  writeFileSync(
    config,
    [
      `application_id: kstate-e2e-${stamp}`,
      `bootstrap_servers: ${bootstrap}`,
      `state_dir: ${join(out, 'state')}`,
      'http:',
      `  listen: 127.0.0.1:${port}`,
      `  ui_dir: ${uiDir}`,
      'views:',
      '  - name: users',
      '    kind: table',
      `    topic: ${topic}`,
      '    key_format: string',
      '    value_format: json',
      '  - name: clicks_per_minute',
      '    kind: count',
      `    topic: ${clickTopic}`,
      '    window: {type: tumbling, size: 1m, grace: 10m, retention: 30d}',
      '  - name: words',
      '    kind: count',
      `    topic: ${linesTopic}`,
      '    group_by: words',
      '',
    ].join('\n'),
  );
  run.log = join(out, 'kstate.log');
  const logFd = openSync(run.log, 'w');
  run.kstate = spawn(binary, ['--config', config], { stdio: ['ignore', logFd, logFd] });
  let exited = null;
  run.kstate.on('exit', (code, signal) => (exited = { code, signal }));

  const deadline = Date.now() + 120_000;
  for (;;) {
    assert.equal(exited, null, `kstate exited (${JSON.stringify(exited)}) before it was ready:\n${logTail(run.log)}`);
    assert.ok(Date.now() < deadline, `kstate not ready within 120 s:\n${logTail(run.log)}`);
    try {
      const r = await fetch(`${run.base}/readyz`);
      if (r.status === 200) {
        // Every record applied: the exact count matches the data set.
        const c = await getJson(`${run.base}/v1/stores/users/count`);
        const w = await getJson(`${run.base}/v1/stores/clicks_per_minute`);
        const applied = w.status === 200 ? w.body.assigned_partitions.reduce((n, a) => n + (a.position ?? 0), 0) : 0;
        if (c.status === 200 && c.body.count === latest.size && applied === run.clicks.lines.length) break;
      }
    } catch {
      // not listening yet
    }
    await sleep(250);
  }

  run.profile = mkdtempSync(join(out, 'chromium-profile-'));
  run.context = await chromium.launchPersistentContext(run.profile, {
    executablePath: chromiumPath,
    headless: true,
    viewport: DESKTOP,
    colorScheme: 'light',
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--no-first-run',
      '--disable-sync',
      '--disable-quic',
    ],
  });
  run.page = run.context.pages()[0] ?? (await run.context.newPage());
  run.page.setDefaultTimeout(20_000);
  run.page.on('pageerror', (e) => run.errors.push(`page error: ${e.message}`));
  run.page.on('console', (m) => {
    if (m.type() === 'error') run.errors.push(`console: ${m.text()}`);
  });
});

after(async () => {
  await run.context?.close().catch(() => {});
  if (run.profile) rmSync(run.profile, { recursive: true, force: true });
  if (run.kstate && run.kstate.exitCode === null) {
    const gone = new Promise((r) => run.kstate.once('exit', r));
    run.kstate.kill('SIGTERM');
    await Promise.race([gone, sleep(15_000)]);
    if (run.kstate.exitCode === null && run.kstate.signalCode === null) run.kstate.kill('SIGKILL');
  }
});

// Live traffic for the charts: for `ms`, rewrites user keys with the values they already
// have (so every assertion still holds) at a few hundred records/s, and looks keys up.
async function activity(ms) {
  const producer = spawn(
    kafkaScript,
    ['console-producer', '--topic', run.topic, '--property', 'parse.key=true', '--property', 'key.separator=\t'],
    { stdio: ['pipe', 'ignore', 'ignore'], env: process.env },
  );
  const done = new Promise((r) => producer.once('exit', r));
  const users = [...run.latest.entries()].filter(([k]) => k.startsWith('user-'));
  const end = Date.now() + ms;
  let i = 0;
  while (Date.now() < end) {
    const batch = [];
    for (let j = 0; j < 40; j++, i++) {
      const [k, v] = users[i % users.length];
      batch.push(`${k}\t${JSON.stringify(v)}`);
    }
    producer.stdin.write(batch.join('\n') + '\n');
    const lookups = [];
    for (let j = 0; j < 3; j++) lookups.push(fetch(`${run.base}/v1/stores/users/keys/${users[(i + j) % users.length][0]}`).then((r) => r.arrayBuffer()));
    await Promise.all(lookups);
    await sleep(100);
  }
  producer.stdin.end();
  await Promise.race([done, sleep(20_000)]);
}

async function shot(name, { fullPage = true } = {}) {
  await run.page.screenshot({ path: join(out, `${name}.png`), fullPage });
}

async function setView(size, scheme) {
  await run.page.setViewportSize(size);
  await run.page.emulateMedia({ colorScheme: scheme });
  await sleep(300); // charts resize and recolor
}

async function open(hash) {
  await run.page.goto(`${run.base}/ui/${hash}`);
}

// Waits until the live charts have at least two samples (a rate needs two).
async function waitForChart() {
  await run.page.locator('.chart canvas').first().waitFor({ state: 'visible', timeout: 30_000 });
  await sleep(2100);
}

// ---- tests ----------------------------------------------------------------------------

test('the dashboard files are served with the right types and cache lifetimes', async () => {
  const index = await fetch(`${run.base}/ui/`);
  assert.equal(index.status, 200);
  assert.match(index.headers.get('content-type'), /^text\/html/);
  assert.equal(index.headers.get('cache-control'), 'no-cache');
  const html = await index.text();
  const asset = html.match(/\/ui\/assets\/[^"]+\.js/);
  assert.ok(asset, 'index.html references a hashed script');
  const js = await fetch(`${run.base}${asset[0]}`);
  assert.equal(js.status, 200);
  assert.match(js.headers.get('content-type'), /^text\/javascript/);
  assert.equal(js.headers.get('cache-control'), 'public, max-age=31536000, immutable');
  const escape = await fetch(`${run.base}/ui/%2e%2e/kstate.yaml`);
  assert.equal(escape.status, 404);
});

test('overview lists this instance as ready', async () => {
  const endpoint = (await getJson(`${run.base}/v1/stores`)).body.served_by;
  await setView(DESKTOP, 'light');
  await open('#/');
  const instances = run.page.getByTestId('instances');
  await instances.getByText(endpoint, { exact: true }).waitFor();
  const row = instances.locator('tbody tr').filter({ hasText: endpoint });
  await row.getByText('ready', { exact: true }).waitFor();
  assert.match(await row.innerText(), /users|e2e-users/);
  await activity(16_000);
  await waitForChart();
  await shot('overview-desktop-light');
  await setView(DESKTOP, 'dark');
  await shot('overview-desktop-dark');
  await setView(PHONE, 'dark');
  await shot('overview-phone-dark');
  await setView(PHONE, 'light');
  await shot('overview-phone-light');
});

test('overview counts the partitions ready exactly as /readyz does, source topics of re-keyed aggregates included', async () => {
  const r = await getJson(`${run.base}/readyz`);
  assert.equal(r.status, 200, 'ready before the tests begin');
  const topics = new Set(r.body.partitions.map((p) => p.topic));
  // users, clicks, lines (read by words) and words' repartition topic: 3 partitions each.
  assert.ok(topics.has(run.linesTopic), `/readyz weighs the source topic of the word count: ${[...topics].join(', ')}`);
  assert.equal(r.body.partitions.length, 12, 'four topics of 3 partitions, all assigned to the one instance');
  const ready = r.body.partitions.filter((p) => p.ready).length;
  assert.equal(ready, 12, '/readyz 200: every partition it lists is ready');

  await setView(DESKTOP, 'light');
  await open('#/');
  const stat = run.page.getByTestId('partitions-ready');
  const value = stat.locator('.stat-value');
  await value.filter({ hasText: /^\d+ \/ \d+$/ }).waitFor(); // loaded
  assert.equal(await value.innerText(), `${ready} / ${r.body.partitions.length}`, 'the overview counts what /readyz counts');
  assert.match(await stat.getAttribute('class'), /\bstat-ok\b/, 'shown as ready, as /readyz says');
  await shot('overview-ready-count-desktop-light', { fullPage: false });
});

test('stores page shows the store with its keys and restore progress', async () => {
  await setView(DESKTOP, 'light');
  await open('#/stores');
  const row = run.page.getByTestId('stores').locator('tbody tr').filter({ hasText: 'users' });
  await row.getByText('3/3').waitFor();
  await shot('stores-desktop-light');
  await setView(PHONE, 'light');
  await shot('stores-phone-light');
  await setView(DESKTOP, 'dark');
  await shot('stores-desktop-dark');
});

test('store detail shows every partition and a live chart', async () => {
  await setView(DESKTOP, 'light');
  await open('#/stores/users');
  const rows = run.page.getByTestId('partitions').locator('tbody tr');
  await rows.nth(2).waitFor();
  assert.equal(await rows.count(), 3);
  await activity(12_000);
  await waitForChart();
  await shot('store-desktop-light');
  await setView(DESKTOP, 'dark');
  await shot('store-desktop-dark');
  await setView(PHONE, 'light');
  await shot('store-phone-light');
});

test('a key lookup through the form shows the latest value, and who served it', async () => {
  await setView(DESKTOP, 'light');
  await open('#/browse/users');
  const page = run.page;
  // user-0030 was updated after it was first written: the newer value must show.
  for (const key of ['user-0030', 'team/alpha', 'héllo', 'with space']) {
    await page.getByTestId('lookup-key').fill(key);
    await page.getByTestId('lookup-submit').click();
    const result = page.getByTestId('lookup-result');
    await result.locator('.key', { hasText: key }).waitFor();
    const shown = JSON.parse(await page.getByTestId('lookup-value').innerText());
    assert.deepEqual(shown, run.latest.get(key), `value of ${key}`);
    assert.match(await result.innerText(), /served by http:\/\/127\.0\.0\.1:\d+/);
    assert.match(await result.innerText(), /position \d+:\d+/);
  }
  await page.getByTestId('lookup-key').fill('user-0030');
  await page.getByTestId('lookup-submit').click();
  await page.getByTestId('lookup-result').locator('.key', { hasText: 'user-0030' }).waitFor();
  await shot('browse-lookup-desktop-light');
  await setView(PHONE, 'light');
  await shot('browse-lookup-phone-light');
  await setView(DESKTOP, 'dark');
  await shot('browse-lookup-desktop-dark');

  // A deleted key: "no value", with the position it was absent at.
  await setView(DESKTOP, 'light');
  await page.getByTestId('lookup-key').fill('user-0050');
  await page.getByTestId('lookup-submit').click();
  const missing = page.getByTestId('lookup-missing');
  await missing.waitFor();
  assert.match(await missing.innerText(), /40402/);
  assert.match(await missing.innerText(), /served by/);
});

test('paging a prefix with "Load more" shows every key exactly once, in order', async () => {
  await setView(DESKTOP, 'light');
  await open('#/browse/users');
  const page = run.page;
  await page.getByTestId('range-prefix').fill('user-');
  await page.getByTestId('range-limit').selectOption('25');
  await page.getByTestId('range-submit').click();
  const keys = page.getByTestId('range-key');
  await keys.first().waitFor();
  let pages = 1;
  for (;;) {
    const more = page.getByTestId('load-more');
    if ((await more.count()) === 0) break;
    const before = await keys.count();
    await more.click();
    await page.waitForFunction((n) => document.querySelectorAll('[data-testid="range-key"]').length > n, before);
    pages++;
    assert.ok(pages < 50, 'paging does not end');
  }
  const shown = await keys.allInnerTexts();
  const expected = [...run.latest.keys()].filter((k) => k.startsWith('user-')).sort();
  assert.equal(new Set(shown).size, shown.length, 'no key shown twice');
  assert.deepEqual(shown, expected, 'every key of the prefix, in byte order');
  assert.equal(pages, Math.ceil(expected.length / 25));
  await page.getByTestId('range-summary').getByText('end of range').waitFor();

  // One row opened: its value pretty-printed.
  await keys.nth(2).click();
  await page.locator('.kv-detail pre').first().waitFor();
  await page.locator('#range').scrollIntoViewIfNeeded();
  await page.evaluate(() => document.getElementById('range').scrollIntoView());
  await shot('browse-range-desktop-light', { fullPage: false });
  await setView(PHONE, 'light');
  await page.evaluate(() => document.getElementById('range').scrollIntoView());
  await shot('browse-range-phone-light', { fullPage: false });
  await setView(DESKTOP, 'dark');
  await page.evaluate(() => document.getElementById('range').scrollIntoView());
  await shot('browse-range-desktop-dark', { fullPage: false });
});

test('a windowed store shows per-minute counts equal to a recount, for one key and across keys', async () => {
  await setView(DESKTOP, 'light');
  await open('#/browse/clicks_per_minute');
  const page = run.page;
  const recount = [...run.clicks.perMinute.entries()]
    .map(([k, n]) => {
      const [user, start] = k.split('|');
      return { user, start: Number(start), n };
    })
    .sort((a, b) => (a.user < b.user ? -1 : a.user > b.user ? 1 : a.start - b.start));

  // One key: every minute of click-user-03, in order.
  await page.getByTestId('kw-key').fill('click-user-03');
  await page.getByTestId('kw-submit').click();
  await page.getByTestId('kw-row').first().waitFor();
  const one = await page.getByTestId('kw-row').evaluateAll((rows) =>
    rows.map((r) => [Number(r.dataset.start), Number(r.querySelector('[data-testid="kw-value"]').dataset.value)]),
  );
  assert.deepEqual(one, recount.filter((w) => w.user === 'click-user-03').map((w) => [w.start, w.n]));
  await page.evaluate(() => document.getElementById('windows').scrollIntoView());
  await shot('browse-windows-key-desktop-light', { fullPage: false });

  // Every key over the whole interval, 25 windows a page, merged across partitions.
  await page.getByTestId('wr-from').fill('2026-12-02T10:00:00Z');
  await page.getByTestId('wr-to').fill('2026-12-02T11:00:00Z');
  await page.getByTestId('wr-limit').selectOption('25');
  await page.getByTestId('wr-submit').click();
  const rows = page.getByTestId('wr-row');
  await rows.first().waitFor();
  let pages = 1;
  for (;;) {
    const more = page.getByTestId('wr-load-more');
    if ((await more.count()) === 0) break;
    const before = await rows.count();
    await more.click();
    await page.waitForFunction((n) => document.querySelectorAll('[data-testid="wr-row"]').length > n, before);
    pages++;
    assert.ok(pages < 50, 'paging does not end');
  }
  const all = await rows.evaluateAll((trs) =>
    trs.map((r) => [
      r.querySelector('[data-testid="wr-key"]').innerText,
      Number(r.dataset.start),
      Number(r.querySelector('[data-testid="wr-value"]').dataset.value),
    ]),
  );
  assert.deepEqual(all, recount.map((w) => [w.user, w.start, w.n]), 'every (key, minute) once, in key then time order');
  assert.equal(pages, Math.ceil(recount.length / 25));
  await page.getByTestId('wr-summary').getByText('end of range').waitFor();
  await page.evaluate(() => document.getElementById('window-range').scrollIntoView());
  await shot('browse-windows-range-desktop-light', { fullPage: false });
  await setView(PHONE, 'dark');
  await page.evaluate(() => document.getElementById('window-range').scrollIntoView());
  await shot('browse-windows-range-phone-dark', { fullPage: false });
});

test('the live view of a prefix shows each change as it is applied, newest first, and nothing else', async () => {
  await setView(DESKTOP, 'light');
  await open('#/browse/users');
  const page = run.page;
  await page.getByTestId('live-prefix').fill('user-02');
  await page.getByTestId('live-follow').click();
  await page.getByTestId('live-summary').locator('.tag', { hasText: 'live' }).waitFor();

  // Changes of the prefix (new values, a deletion) and one outside it, produced after
  // the view started following; the model is updated for the tests after this one.
  const changed = [];
  for (let i = 201; i <= 204; i++) changed.push([`user-0${i}`, { name: `Live ${i}`, visits: i }]);
  changed.push(['user-0205', null]);
  const lines = [...changed, ['team/beta', { name: 'Team Beta' }]].map(([k, v]) => `${k}\t${v === null ? 'NULL' : JSON.stringify(v)}`);
  kafka(
    ['console-producer', '--topic', run.topic, '--property', 'parse.key=true', '--property', 'key.separator=\t', '--property', 'null.marker=NULL'],
    lines.join('\n') + '\n',
  );
  for (const [k, v] of [...changed, ['team/beta', { name: 'Team Beta' }]]) {
    if (v === null) run.latest.delete(k);
    else run.latest.set(k, v);
  }

  await page.waitForFunction((n) => document.querySelectorAll('[data-testid="live-row"]').length >= n, changed.length, { timeout: 30_000 });
  await sleep(1000); // anything else would have come by now
  const keys = await page.getByTestId('live-key').allInnerTexts();
  const values = await page.getByTestId('live-value').allInnerTexts();
  // Rows come newest first in arrival order, which interleaves partitions: compared as
  // a set, each with its own value.
  assert.deepEqual([...keys].sort(), changed.map(([k]) => k).sort(), 'exactly the changes of the prefix');
  for (let i = 0; i < keys.length; i++) {
    const want = changed.find(([k]) => k === keys[i])[1];
    if (want === null) assert.equal(values[i], 'deleted');
    else assert.deepEqual(JSON.parse(values[i]), want, `value of ${keys[i]}`);
  }
  assert.match(await page.getByTestId('live-summary').innerText(), /\b5\s+changes since following/);
  assert.match(await page.getByTestId('live-position').innerText(), /^\d+:\d+(,\d+:\d+)*$/);
  await page.evaluate(() => document.getElementById('live').scrollIntoView());
  await shot('browse-live-desktop-light', { fullPage: false });
  await setView(PHONE, 'light');
  await page.evaluate(() => document.getElementById('live').scrollIntoView());
  await shot('browse-live-phone-light', { fullPage: false });
  await setView(DESKTOP, 'dark');
  await shot('browse-live-desktop-dark', { fullPage: false });
  await page.getByTestId('live-stop').click();
});

test('the live view of a range with current values first shows the entries, then keeps them current', async () => {
  await setView(DESKTOP, 'light');
  await open('#/browse/users');
  const page = run.page;
  await page.getByTestId('live-mode').selectOption('range');
  await page.getByTestId('live-from').fill('user-0010');
  await page.getByTestId('live-to').fill('user-0020');
  await page.getByTestId('live-snapshot').check();
  await page.getByTestId('live-follow').click();
  await page.getByTestId('live-summary').locator('.tag', { hasText: 'live' }).waitFor();

  // The model's current entries of [user-0010, user-0020).
  const inRange = () => [...run.latest.keys()].filter((k) => k >= 'user-0010' && k < 'user-0020').sort();
  const shown = async () => {
    const keys = await page.getByTestId('live-current-key').allInnerTexts();
    const values = await page.getByTestId('live-current-value').allInnerTexts();
    return new Map(keys.map((k, i) => [k, JSON.parse(values[i])]));
  };
  let got = await shown();
  assert.deepEqual([...got.keys()].sort(), inRange(), 'the current entries of the range');
  for (const [k, v] of got) assert.deepEqual(v, run.latest.get(k), `value of ${k}`);

  // A new value of one key and a deletion of another: the current entries follow.
  const [first, second] = inRange();
  const lines = [`${first}\t${JSON.stringify({ name: 'Changed live', visits: 1 })}`, `${second}\tNULL`];
  kafka(
    ['console-producer', '--topic', run.topic, '--property', 'parse.key=true', '--property', 'key.separator=\t', '--property', 'null.marker=NULL'],
    lines.join('\n') + '\n',
  );
  run.latest.set(first, { name: 'Changed live', visits: 1 });
  run.latest.delete(second);
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="live-row"]').length >= 2, null, { timeout: 30_000 });
  got = await shown();
  assert.deepEqual([...got.keys()].sort(), inRange(), 'the deleted key is gone');
  assert.deepEqual(got.get(first), { name: 'Changed live', visits: 1 });
  await page.evaluate(() => document.getElementById('live').scrollIntoView());
  await shot('browse-live-snapshot-desktop-light', { fullPage: false });
  await page.getByTestId('live-stop').click();
});

test('API errors are shown as readable problems, not blank panels', async () => {
  await setView(DESKTOP, 'light');
  // A key that is not a long: 400 bad_key_encoding from the API.
  await open('#/browse/users');
  const page = run.page;
  await page.getByTestId('lookup-format').selectOption('long');
  await page.getByTestId('lookup-key').fill('not-a-number');
  await page.getByTestId('lookup-submit').click();
  const problem = page.locator('#lookup .problem');
  await problem.waitFor();
  assert.match(await problem.innerText(), /40002/);
  await shot('browse-error-desktop-light', { fullPage: false });

  // An unknown store.
  await open('#/stores/no-such-store');
  const p2 = page.locator('.problem').first();
  await p2.waitFor();
  assert.match(await p2.innerText(), /40401/);
  assert.match(await p2.innerText(), /no-such-store/);
  await shot('store-unknown-desktop-light', { fullPage: false });
});

test('no script errors on any page', () => {
  // 404s the tests provoked on purpose show up as failed resource loads; anything else
  // is a bug in the page.
  const unexpected = run.errors.filter((e) => !/status of (400|404)/.test(e));
  assert.deepEqual(unexpected, []);
});
