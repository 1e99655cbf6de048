"""The word count of scripts/bench: the same lines of text counted by kstate's
`group_by: words` count view (exactly_once) and by Kafka Streams' WordCountDemo topology
(exactly_once_v2), each checked word for word against the generator's counts."""
import http.client
import json
import shutil
import time

from .common import BD, Proc, die, free_port, get, kstate_proc, log

TOPIC = "lines"
VOCABULARY = 20_000


def kstate_counts(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("GET", "/v1/stores/words/keys", headers={"Accept": "application/x-ndjson"})
    r = c.getresponse()
    if r.status != 200:
        raise ValueError(f"kstate's word scan answered {r.status}: {r.read()[:300]!r}")
    out = {}
    for line in r.read().decode().splitlines():
        e = json.loads(line)
        out[e["key"]] = int(e["value"])
    return out


def streams_counts(port):
    st, body = get(port, "/bench/counts", timeout=600)
    if st != 200:
        raise ValueError(f"Kafka Streams' word counts answered {st}: {body[:300]!r}")
    out = {}
    for line in body.decode().splitlines():
        w, n = line.split("\t")
        out[w] = int(n)
    return out


def start_kstate(h, app, state, port):
    return kstate_proc(h, app, state, port, f"""  - name: words
    kind: count
    topic: {TOPIC}
    group_by: words
""")


def start_streams(h, app, state, port):
    cp = f"{BD / 'streams/target/classes'}:{BD / 'streams/target/lib'}/*"
    cmd = ["java", "-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", cp,
           "bench.WordCount", f"bootstrap={h.bootstrap}", f"topic={TOPIC}", f"app_id={app}", f"state_dir={state}",
           f"port={port}", "stream_threads=2", "guarantee=exactly_once_v2", f"cache_mb={h.cache_mb}"]
    return Proc(app, cmd, h.work / f"{app}.log")


def measure(h, label, start, counts, expected, total, rep):
    """One run from empty state: lines/s and CPU per line from the first poll that sees a
    counted word to the one that sees every word counted, then every count compared with
    the generator's. Both systems are polled alike: every count, summed, every 0.25 s
    (kstate sends fewer repartition records than words, so its record counters cannot
    say how many words are counted)."""
    app = f"bench-wc-{label}-{rep}-{int(time.time())}"
    state = h.work / f"{app}-state"
    shutil.rmtree(state, ignore_errors=True)
    port = free_port()
    t_start = time.monotonic()
    proc = start(h, app, state, port)
    first = None
    while True:
        if not proc.alive():
            die(f"{app} exited during the word count (log: {proc.logfile})")
        try:
            n = sum(counts(port).values())
        except (OSError, ValueError, KeyError, http.client.HTTPException):
            n = 0  # not serving yet
        now = time.monotonic()
        if n:
            if first is None:
                first = (now, n, proc.cpu())
            if n >= total:
                break
        if now - t_start > 3600:
            die(f"{app} did not count every word within an hour ({n}/{total})")
        time.sleep(0.25)
    t_done, cpu_done = time.monotonic(), proc.cpu()
    t0, n0, c0 = first
    # The lines behind the words counted between the first poll and the last.
    lines = h.a.lines * (total - n0) / total
    span = t_done - t0
    lps = lines / span
    cpu_per_m = (cpu_done - c0) / lines * 1e6
    got = counts(port)
    proc.stop()
    if got != expected:
        wrong = [w for w in expected if got.get(w) != expected[w]][:5]
        extra = [w for w in got if w not in expected][:5]
        die(f"{label}'s word counts differ from the input's: {len(got)} words against {len(expected)}, "
            f"e.g. {[(w, got.get(w), expected[w]) for w in wrong]}, unexpected {extra}")
    log(f"{label} word count #{rep}: {lps:,.0f} lines/s, {cpu_per_m:.2f} CPU-s per M lines, "
        f"{t_done - t_start:.1f}s from process start; {len(got):,} words, every count equal to the input's")
    h.rec("wordcount_lps", label, lps)
    h.rec("wordcount_cpu_s_per_m", label, cpu_per_m)
    h.rec("wordcount_wall_s", label, t_done - t_start)
    shutil.rmtree(state, ignore_errors=True)


def run_wordcount(h):
    a = h.a
    h.kafka("topics", "--create", "--topic", TOPIC, "--partitions", str(a.partitions), "--replication-factor", "1")
    countfile = h.work / "wordcounts.tsv"
    log(f"producing {a.lines:,} lines over a vocabulary of {VOCABULARY:,} words")
    res = json.loads(h.java("bench.Fill", "lines", f"bootstrap={h.bootstrap}", f"topic={TOPIC}",
                            f"records={a.lines}", f"keys={VOCABULARY}", f"countfile={countfile}",
                            "seed=7").strip().splitlines()[-1])
    log(f"lines: {res['rps']:,.0f} records/s (Java producer)")
    expected, total = {}, 0
    for line in countfile.read_text().splitlines():
        w, n = line.rsplit("\t", 1)
        if w == "\ttotal":
            total = int(n)
        else:
            expected[w] = int(n)
    if sum(expected.values()) != total:
        die("the generator's word counts do not add up")
    h.wordcount_check = {"lines": a.lines, "words": total, "distinct_words": len(expected)}
    for rep in range(a.wordcount_repeats):
        measure(h, "kstate", start_kstate, kstate_counts, expected, total, rep)
    for rep in range(a.wordcount_repeats):
        measure(h, "kafka_streams", start_streams, streams_counts, expected, total, rep)
