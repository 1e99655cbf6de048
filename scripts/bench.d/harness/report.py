"""The table scripts/bench prints, and the JSON it writes with --out."""
import json
import os
import subprocess
from pathlib import Path

from .common import BD, BUILD, ROOT, log, machine, median_spread, out

# (title, JSON key, the source of the limit column or None). A row is printed when the
# run measured its figure; the JSON has every key of the run.
ROWS = [
    ("ingest (records/s)", "ingest_rps", "limit"),
    ("  store write limit (records/s)", "ingest_rps", "limit_store_write"),
    ("ingest CPU-s per M records", "ingest_cpu_s_per_m", "limit"),
    ("ingest wall time from start (s)", "ingest_wall_s", None),
    ("word count (input lines/s)", "wordcount_lps", None),
    ("word count CPU-s per M lines", "wordcount_cpu_s_per_m", None),
    ("join x3 (input records/s from start)", "join_rps", None),
    ("join x3 CPU-s per M input records", "join_cpu_s_per_m", None),
    ("join x3 wall time from start (s)", "join_wall_s", None),
    ("foreign-key join x2 (input records/s)", "fkjoin_rps", None),
    ("foreign-key join x2 CPU-s per M input", "fkjoin_cpu_s_per_m", None),
    ("foreign-key join x2 wall time (s)", "fkjoin_wall_s", None),
    ("lookups uniform (req/s, 64 conns)", "lookup_rps", "limit"),
    ("  store limit: RocksDB Get/s (2 thr)", "lookup_rps", "limit_store"),
    ("lookups skewed (req/s)", "lookup_zipf_rps", None),
    ("lookup CPU per request (us)", "lookup_cpu_us", "limit"),
    ("  floor: trivial + in-process read (us)", "lookup_cpu_us", "limit_floor"),
    ("batchGet CPU per key (us)", "batch_get_cpu_us_per_key", None),
    ("batchGet keys/s (100 per request)", "batch_get_keys_per_s", None),
    ("p50 at fixed rate (ms)", "lookup_p50_ms", "limit"),
    ("p99 at fixed rate (ms)", "lookup_p99_ms", "limit"),
    ("p99.9 at fixed rate (ms)", "lookup_p999_ms", "limit"),
    ("range limit=10 (scans/s)", "range10_rps", None),
    ("range limit=100 (scans/s)", "range100_rps", None),
    ("range limit=10 CPU per page (us)", "range10_cpu_us", None),
    ("range limit=100 CPU per page (us)", "range100_cpu_us", None),
    ("lookups during appends (req/s)", "lookup_rps_during_ingest", None),
    ("lookups during full ingest (req/s)", "lookup_rps_during_full_ingest", None),
    ("  p99 during full ingest (ms)", "lookup_p99_ms_during_full_ingest", None),
    ("restart after SIGTERM (s)", "restart_sigterm_s", None),
    ("restart after kill -9 (s)", "restart_sigkill_s", None),
    ("restart after kill -9, EOS (s)", "restart_sigkill_eos_s", None),
    ("restart with empty state (s)", "restart_empty_s", None),
    ("rebuild from empty (records/s)", "restart_empty_rps", "limit"),
    ("  kstate defaults: after SIGTERM (s)", "restart_sigterm_default_s", None),
    ("  kstate defaults: after kill -9 (s)", "restart_sigkill_default_s", None),
    ("scale-out: newcomer answers (s)", "bootstrap_new_instance_s", None),
    ("RSS steady (MiB)", "rss_mb", None),
    ("RSS peak (MiB)", "rss_peak_mb", None),
]


# The JSON name of each limit column.
LIMIT_KEYS = {"limit": "limit", "limit_store_write": "limit_store_write_rps", "limit_store": "limit_store_get_rps",
              "limit_floor": "limit_floor"}


def versions():
    def first_line(cmd):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
            return (r.stdout or r.stderr).strip().splitlines()[0]
        except (OSError, IndexError):
            return None

    def deb(pkg):
        try:
            return out(["dpkg-query", "-W", "-f=${Version}", pkg]).strip() or None
        except subprocess.CalledProcessError:
            return None

    return {
        "kstate": first_line([BUILD / "server" / "kstate", "--version"]),
        "kstate_git": first_line(["git", "-C", ROOT, "describe", "--always", "--dirty"]),
        "kafka": os.environ.get("KSTATE_KAFKA_VERSION", "3.9.2"),
        "kafka_streams": "3.9.2",
        "librdkafka": deb("librdkafka-dev"),
        "rocksdb": deb("librocksdb-dev"),
        "rocksdbjni": next((p.name[len("rocksdbjni-"):-4]
                            for p in (BD / "streams/target/lib").glob("rocksdbjni-*.jar")), None),
        "boost": deb("libboost1.81-dev"),
        "jdk": first_line(["java", "-version"]),
        "wrk": deb("wrk"),
        "h2load": deb("nghttp2-client"),
        "gcc": first_line(["g++", "--version"]),
    }


def fmt(v):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3f}"


def report(h):
    """Prints the table of medians and ratios; writes every figure to --out."""
    def samples(fig, system):
        return h.r.get(fig, {}).get(system, []) if system else []

    def med(fig, system):
        return median_spread(samples(fig, system))[0]

    result = {}
    lines = []
    hdr = f"{'figure':38} {'kstate':>12} {'Kafka Streams':>14} {'limit':>12} {'kstate/KS':>10} {'kstate/limit':>12}"
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for title, key, lim in ROWS:
        k, s, l = med(key, "kstate"), med(key, "kafka_streams"), med(key, lim)
        if k is None and s is None and l is None:
            continue
        entry = result.setdefault(key, {"kstate": k, "kafka_streams": s})
        spread = entry.setdefault("spread", {})
        for name, src in (("kstate", "kstate"), ("kafka_streams", "kafka_streams"), (lim, lim)):
            vals = samples(key, src)
            if vals:
                spread[name] = {"min": min(vals), "max": max(vals), "n": len(vals)}
        if lim:
            entry[LIMIT_KEYS.get(lim, lim)] = l
        r1 = k / s if k is not None and s else None
        r2 = k / l if k is not None and l else None
        sub = title.startswith("  ") and lim  # a second limit of the figure above: only the limit and its ratio
        lines.append(f"{title:38} {'' if sub else fmt(k):>12} {'' if sub else fmt(s):>14} {fmt(l):>12} "
                     f"{('' if sub else f'{r1:.2f}' if r1 is not None else '-'):>10} "
                     f"{(f'{r2:.2f}' if r2 is not None else '-'):>12}")
    for key in ("join_rps", "join_cpu_s_per_m", "join_wall_s", "fkjoin_rps", "fkjoin_cpu_s_per_m", "fkjoin_wall_s"):
        if key in result and h.r[key].get("kafka_streams_no_cache"):
            result[key]["kafka_streams_no_cache"] = med(key, "kafka_streams_no_cache")
    fwd = getattr(h, "fwd", None)
    if fwd is not None or "forwarded" in h.sections:
        result["forwarded_lookup_rps"] = (
            {"kstate": fwd["remote"], "kstate_local": fwd["local"], "ratio": fwd["remote"] / fwd["local"]}
            if fwd else None)
        text = f"{fmt(fwd['remote'])} ({fwd['remote'] / fwd['local']:.2f} of local)" if fwd else "null (not available)"
        lines.append(f"{'forwarded lookups (req/s)':38} {text:>12}")
    for key in ("lookup_404_ratio", "fixed_rate_404_ratio"):
        if key in h.r:
            result[key] = {s: med(key, s) for s in ("kstate", "kafka_streams", "limit")}
    if getattr(h, "front_end", None):
        result["kafka_streams_front_end"] = h.front_end
    for attr in ("rate", "body_bytes", "prefill_rps", "wordcount_check", "join_check", "fkjoin_check"):
        if getattr(h, attr, None) is not None:
            result[{"rate": "fixed_rate_offered_rps", "body_bytes": "lookup_body_bytes"}.get(attr, attr)] = getattr(h, attr)
    result["mode"] = "quick" if h.a.quick else "full"
    result["sections"] = sorted(h.sections)
    result["config"] = {k: getattr(h.a, k) for k in ("records", "keys", "partitions", "repeats", "ingest_repeats",
                                                     "restart_repeats", "empty_repeats", "duration", "warmup",
                                                     "append_rate", "sample", "lines", "join_records",
                                                     "join_keys", "join_repeats")}
    result["machine"] = machine()
    result["load"] = {name: list(v) for name, v in h.loads}
    result["notes"] = h.notes
    result["versions"] = versions()
    result["raw"] = h.r
    print()
    if getattr(h, "end", None) is not None:
        print(f"kstate benchmark ({result['mode']}: {h.a.records:,} records, {h.a.keys:,} keys, "
              f"{h.a.partitions} partitions; medians of {h.a.repeats} lookup runs of {h.a.duration}s, "
              f"{h.a.ingest_repeats} ingest runs; sections: {', '.join(sorted(h.sections))})")
    else:  # no table was filled: only the sections with topics of their own ran
        print(f"kstate benchmark ({result['mode']}: {h.a.partitions} partitions; "
              f"sections: {', '.join(sorted(h.sections))})")
    print("\n".join(lines))
    if getattr(h, "rate", None):
        print(f"fixed rate offered: {h.rate:,.0f} req/s (half of the lower maximum)")
    if "lookup_404_ratio" in result:
        r = result["lookup_404_ratio"]
        print(f"404 ratio of uniform lookups: kstate {fmt(r['kstate'])}, Kafka Streams {fmt(r['kafka_streams'])}")
    def no_cache(fig, title):
        nc = {f: med(f"{fig}_{f}", "kafka_streams_no_cache") for f in ("rps", "cpu_s_per_m", "wall_s")}
        if nc["rps"] is not None:
            k = med(f"{fig}_rps", "kstate"), med(f"{fig}_cpu_s_per_m", "kstate")
            ratios = (f" (kstate/KS {k[0] / nc['rps']:.2f} rate, {k[1] / nc['cpu_s_per_m']:.2f} CPU)"
                      if None not in k else "")
            print(f"{title}, Kafka Streams with its record cache off: {fmt(nc['rps'])} input records/s, "
                  f"{fmt(nc['cpu_s_per_m'])} CPU-s per M, {fmt(nc['wall_s'])} s from start{ratios}")

    if getattr(h, "join_check", None):
        c = h.join_check
        no_cache("join", "join x3")
        print(f"join: {c['input_records']:,} input records; rows "
              f"{', '.join(f'{t} {n:,}' for t, n in c['rows'].items())}; kstate equal to the input's joins; "
              f"Kafka Streams with its record cache off identical to kstate: "
              f"{c.get('identical_to_kafka_streams_no_cache', False)}; rows of Kafka Streams with its default "
              f"cache that differ, per run: {c.get('kafka_streams_differing_rows')}")
    if getattr(h, "fkjoin_check", None):
        c = h.fkjoin_check
        no_cache("fkjoin", "foreign-key join x2")
        print(f"foreign-key join: {c['input_records']:,} input records; {c['orders']:,} orders at the end, "
              f"{c['naming_none']:,} naming no customer, {c['naming_absent']:,} naming an absent one; rows "
              f"{', '.join(f'{t} {n:,}' for t, n in c['rows'].items())}; kstate equal to the input's joins; "
              f"Kafka Streams with its record cache off identical to kstate: "
              f"{c.get('identical_to_kafka_streams_no_cache', False)} (retained inner rows: "
              f"{c.get('kafka_streams_no_cache_retained_inner_rows')}, the rest identical); rows of Kafka Streams "
              f"with its default cache that differ, per run: {c.get('kafka_streams_differing_rows')}")
    print(f"load average: {', '.join(f'{n} {v[0]:.1f}' for n, v in h.loads)}")
    for n in h.notes:
        print("note:", n)
    if h.a.out:
        Path(h.a.out).write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {h.a.out}")
