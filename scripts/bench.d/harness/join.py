"""The join section of scripts/bench: two tables joined on the key (inner, left, outer)
by three kstate join views (exactly_once) and by a Kafka Streams application with the
same three KTable-KTable joins (bench.Join, exactly_once_v2). Every row of every join,
read once a system has consumed everything, is compared as parsed JSON: kstate's with
the joins of the generator's last values, and Kafka Streams' with kstate's.

Kafka Streams runs twice over: with its default record cache (the figures a user gets)
and with the cache off. With the cache, some of its rows differ (rows of keys whose
sides were deleted, rows missing, sides that are not their last values; see
docs/BENCHMARKS.md): they are counted by kind and shown, not fatal. With the cache off
every row must be identical to kstate's, or the section fails."""
import http.client
import json
import shutil
import time
import urllib.parse

from .common import BD, Proc, die, free_port, get, kstate_proc, log

LEFT, RIGHT = "join-left", "join-right"
TYPES = ("inner", "left", "outer")
PAGE = 1000  # kstate's query.max_limit default


def expected_joins(statefile):
    """{type: {key: joined value}} from the generator's last value of each side."""
    want = {t: {} for t in TYPES}
    for line in statefile.read_text(encoding="utf-8").splitlines():
        key, lv, rv = line.split("\t")
        left = json.loads(lv) if lv else None
        right = json.loads(rv) if rv else None
        row = {"left": left, "right": right}
        if lv and rv:
            want["inner"][key] = row
        if lv:
            want["left"][key] = row
        if lv or rv:
            want["outer"][key] = row
    return want


# ---- kstate ---------------------------------------------------------------------------

def start_kstate(h, app, state, port):
    views = "".join(f"""  - name: j_{t}
    kind: join
    topic: {LEFT}
    key_format: string
    join: {{type: {t}, right: {RIGHT}}}
""" for t in TYPES)
    return kstate_proc(h, app, state, port, views)


def kstate_has(port, t, key):
    return get(port, f"/v1/stores/j_{t}/keys/{urllib.parse.quote(key, safe='')}", timeout=5)[0] == 200


def kstate_rows(port, t, view_prefix="j_"):
    """Every row of view <view_prefix><t>, read in range pages of PAGE."""
    view = view_prefix + t
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    rows, cursor = {}, None
    while True:
        q = f"limit={PAGE}" + (f"&cursor={urllib.parse.quote(cursor, safe='')}" if cursor else "")
        c.request("GET", f"/v1/stores/{view}/keys?{q}")
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            die(f"kstate's range page of {view} answered {r.status}: {body[:300]!r}")
        page = json.loads(body)
        for e in page["data"]:
            rows[e["key"]] = e["value"]
        cursor = page["metadata"]["next"]
        if cursor is None:
            c.close()
            return rows


# ---- Kafka Streams --------------------------------------------------------------------

def start_streams(h, app, state, port, extra=(), left=LEFT, right=RIGHT):
    cp = f"{BD / 'streams/target/classes'}:{BD / 'streams/target/lib'}/*"
    cmd = ["java", "-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", cp,
           "bench.Join", f"bootstrap={h.bootstrap}", f"left={left}", f"right={right}", f"app_id={app}",
           f"state_dir={state}", f"port={port}", "stream_threads=2", "guarantee=exactly_once_v2",
           f"cache_mb={h.cache_mb}", *extra]
    return Proc(app, cmd, h.work / f"{app}.log")


def start_streams_no_cache(h, app, state, port):
    return start_streams(h, app, state, port, ("record_cache_bytes=0",))


def streams_has(port, t, key):
    return get(port, f"/bench/key/{t}/{urllib.parse.quote(key, safe='')}", timeout=5)[0] == 200


def streams_rows(port, t):
    st, body = get(port, f"/bench/join/{t}", timeout=600)
    if st != 200:
        die(f"Kafka Streams' join store {t} answered {st}: {body[:300]!r}")
    rows = {}
    for line in body.decode("utf-8").splitlines():
        key, value = line.split("\t", 1)
        rows[key] = json.loads(value)
    return rows


# label -> how to start it, whether a store holds a key, every row of a store.
SYSTEMS = {"kstate": (start_kstate, kstate_has, kstate_rows),
           "kafka_streams": (start_streams, streams_has, streams_rows),
           "kafka_streams_no_cache": (start_streams_no_cache, streams_has, streams_rows)}


# ---- the section ----------------------------------------------------------------------

def differences(a, b, limit=5):
    """The first `limit` (None: all) keys whose rows differ between two {key: row} maps,
    as (key, row in a, row in b)."""
    out = []
    for k in sorted(a.keys() | b.keys()):
        if a.get(k) != b.get(k):
            out.append((k, a.get(k), b.get(k)))
            if len(out) == limit:
                break
    return out


def measure(h, label, markers, total, rep, systems=SYSTEMS, types=TYPES, fig="join"):
    """One run from empty state: from the launch until every join (`types`) holds every
    end marker (polled every 0.1 s), the input records per second and the process's CPU
    per million input records over that time, recorded as <fig>_rps, <fig>_cpu_s_per_m
    and <fig>_wall_s; then every row of each join."""
    start, has, rows = systems[label]
    app = f"bench-{fig}-{label}-{rep}-{int(time.time())}"
    state = h.work / f"{app}-state"
    shutil.rmtree(state, ignore_errors=True)
    port = free_port()
    t_start = time.monotonic()
    proc = start(h, app, state, port)
    pending = [(t, k) for t in types for k in markers]
    while pending:
        if not proc.alive():
            die(f"{app} exited during the join (log: {proc.logfile})")
        pending = [(t, k) for t, k in pending if not has(port, t, k)]
        if pending:
            if time.monotonic() - t_start > 3600:
                die(f"{app} did not join every input within an hour ({len(pending)} end markers missing)")
            time.sleep(0.1)
    wall, cpu = time.monotonic() - t_start, proc.cpu()
    got = {t: rows(port, t) for t in types}
    proc.stop()
    shutil.rmtree(state, ignore_errors=True)
    rps = total / wall
    cpu_per_m = cpu / total * 1e6
    log(f"{label} {fig} #{rep}: {rps:,.0f} input records/s, {cpu_per_m:.2f} CPU-s per M input records, "
        f"{wall:.1f}s from process start; rows: " + ", ".join(f"{t} {len(got[t]):,}" for t in types))
    h.rec(f"{fig}_rps", label, rps)
    h.rec(f"{fig}_cpu_s_per_m", label, cpu_per_m)
    h.rec(f"{fig}_wall_s", label, wall)
    return got


def describe(k, row, want):
    """A row (None: none) by the seq of its sides, against the input's (`want`)."""
    def sides(r):
        if r is None:
            return "no row"
        return ", ".join(f"{side} " + ("null" if r[side] is None else f"seq {r[side].get('seq')}")
                         for side in ("left", "right"))
    return f"{k}: {sides(row)} in the row; {sides(want)} in the input's join"


def difference_kind(row, want):
    """Why a row differs from the input's join (None: no row), in a few words."""
    if row is None:
        return "a row missing"
    if want is None:
        return "a row the input does not have"
    return ", ".join(f"{side} " + ("deleted at the end" if want[side] is None else "not its last value")
                     for side in ("left", "right") if row[side] != want[side])


def cached_differences(h, what, rep, kstate, got, want, types, kind=lambda t, k, row, w: difference_kind(row, w)):
    """Kafka Streams with its default record cache against kstate's rows (equal to the
    input's): the differing rows counted by join type and `kind`, each kind noted with
    examples. Not fatal: its identity is checked with the cache off."""
    kinds = {}
    for t in types:
        for k, _, row in differences(kstate[t], got[t], limit=None):
            w = want[t].get(k)
            kinds.setdefault(f"{t}: {kind(t, k, row, w)}", []).append(describe(k, row, w))
    for kind, rows in kinds.items():
        h.note(f"Kafka Streams {what} (default record cache) run #{rep}: {len(rows):,} rows, {kind}; e.g. "
               + "; ".join(rows[:3]))
    return {kind: len(rows) for kind, rows in kinds.items()}


def run_join(h):
    a = h.a
    for topic in (LEFT, RIGHT):
        h.kafka("topics", "--create", "--topic", topic, "--partitions", str(a.partitions), "--replication-factor", "1")
    statefile = h.work / "join-sides.tsv"
    log(f"producing {a.join_records:,} records on each side over {a.join_keys:,} keys")
    res = json.loads(h.java("bench.Fill", "join", f"bootstrap={h.bootstrap}", f"left={LEFT}", f"right={RIGHT}",
                            f"records={a.join_records}", f"keys={a.join_keys}", f"partitions={a.partitions}",
                            f"statefile={statefile}", "seed=11").strip().splitlines()[-1])
    log(f"join input: {res['records']:,} records, {res['rps']:,.0f} records/s (Java producer)")
    total = res["records"]
    want = expected_joins(statefile)
    markers = [k for k in want["inner"] if k.startswith("~end-")]
    if len(markers) != a.partitions:
        die(f"the generator wrote {len(markers)} end markers for {a.partitions} partitions")
    rows = {t: len(want[t]) for t in TYPES}
    h.join_check = {"records_per_side": a.join_records, "keys": a.join_keys, "input_records": total, "rows": rows}

    kstate = None
    for rep in range(a.join_repeats):
        got = measure(h, "kstate", markers, total, rep)
        for t in TYPES:
            diff = differences(got[t], want[t])
            if diff:
                die(f"kstate's {t} join differs from the joins of the input's last values ({len(got[t]):,} rows "
                    f"against {len(want[t]):,}); first differences (key, kstate, input): {diff}")
        kstate = kstate or got
    log("kstate: every row of the inner, left and outer joins equals the joins of the input's last values")

    # Kafka Streams as its users run it: the record cache at its default.
    h.join_check["kafka_streams_differing_rows"] = [
        cached_differences(h, "join", rep, kstate, measure(h, "kafka_streams", markers, total, rep), want, TYPES)
        for rep in range(a.join_repeats)]

    # The identity check proper: Kafka Streams with the record cache off, row for row.
    got = measure(h, "kafka_streams_no_cache", markers, total, 0)
    for t in TYPES:
        diff = differences(kstate[t], got[t])
        if diff:
            die(f"kstate's {t} join differs from Kafka Streams' (record cache off) ({len(kstate[t]):,} rows "
                f"against {len(got[t]):,}); first differences (key, kstate, Kafka Streams): {diff}")
    h.join_check["identical_to_kafka_streams_no_cache"] = True
    log("join: every row of the inner, left and outer joins is identical in kstate and Kafka Streams with its "
        "record cache off (parsed JSON), and equal to the joins of the input's last values: "
        + ", ".join(f"{t} {rows[t]:,} rows" for t in TYPES))
