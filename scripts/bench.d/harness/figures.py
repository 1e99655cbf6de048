"""The figures of scripts/bench: each method measures one thing on one system and records it."""
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from .common import (ALL, BD, BUILD, ROOT, STORE, TOOLS, TOPIC, Proc, die, free_port, get, load, log, out, out_json,
                     run, wait_until)
from .systems import Kstate, Streams

class Harness:
    def __init__(self, a):
        self.a = a
        self.cache_mb = 64  # kstate's rocksdb.block_cache_mb default
        self.work = Path(tempfile.mkdtemp(prefix="kstate-bench."))
        self.kafka_run = Path(tempfile.mkdtemp(prefix="kstate-bench-kafka."))
        self.env = dict(os.environ, KSTATE_KAFKA_RUN=str(self.kafka_run))
        self.bootstrap = None
        self.r = {}  # figure -> system -> list of values
        self.notes = []
        self.loads = []
        self.sections = set()  # what this run measured (scripts/bench --only)

    def rec(self, fig, system, value):
        self.r.setdefault(fig, {}).setdefault(system, []).append(value)

    def note(self, msg):
        log("note: " + msg)
        self.notes.append(msg)

    # -- setup ------------------------------------------------------------------------

    def build(self):
        log(f"load before build: {load()}")
        run([ROOT / "scripts" / "setup"])  # Debian packages (skipped when present)
        cache = BUILD / "CMakeCache.txt"
        if not (BUILD / "build.ninja").exists() or "KSTATE_BENCH_TOOLS:BOOL=ON" not in cache.read_text():
            run(["cmake", "-S", ROOT, "-B", BUILD, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 "-DKSTATE_BUILD_TESTS=OFF", "-DKSTATE_BENCH_TOOLS=ON"], stdout=subprocess.DEVNULL)
        log("building kstate and the store tools (Release, ninja -j2)")
        run(["ninja", "-C", BUILD, "-j2", "kstate", "store_writes", "rocks_reads"], stdout=subprocess.DEVNULL)
        TOOLS.mkdir(parents=True, exist_ok=True)

        def stale(dst, src):
            return not dst.exists() or dst.stat().st_mtime < src.stat().st_mtime

        if stale(TOOLS / "rawconsume", BD / "rawconsume.c"):
            log("compiling rawconsume")
            run(["gcc", "-O2", "-Wall", "-o", TOOLS / "rawconsume", BD / "rawconsume.c", "-lrdkafka"])
        if stale(TOOLS / "trivial_server", BD / "trivial_server.cc"):
            log("compiling trivial_server")
            run(["g++", "-std=c++20", "-O2", "-o", TOOLS / "trivial_server", BD / "trivial_server.cc", "-lpthread"])
        log("building the Kafka Streams baseline (maven)")
        run(["mvn", "-q", "-B", "-f", BD / "streams" / "pom.xml", "package", "dependency:copy-dependencies",
             "-DskipTests"], stdout=subprocess.DEVNULL)
        missing = [pkg for tool, pkg in (("wrk", "wrk"), ("h2load", "nghttp2-client")) if not shutil.which(tool)]
        # Only the sections that send lookups need the load generators.
        if missing and self.sections & {"lookups", "latency", "appends", "full-ingest", "forwarded"}:
            # The load generators, from Debian like everything else.
            log(f"installing {' '.join(missing)}")
            sudo = [] if os.geteuid() == 0 else ["sudo"]
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            run([*sudo, "apt-get", "update", "-qq"], env=env)
            run([*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env,
                stdout=subprocess.DEVNULL)

    def kafka(self, *args, capture=True):
        cmd = [ROOT / "scripts" / "kafka", *args]
        if capture:
            return out(cmd, env=self.env)
        return run(cmd, env=self.env)

    def start_kafka(self):
        log("starting the broker")
        self.bootstrap = self.kafka("start").strip().splitlines()[-1]
        log(f"broker at {self.bootstrap}")

    def java(self, *args, capture=True):
        cp = f"{BD / 'streams/target/classes'}:{BD / 'streams/target/lib'}/*"
        cmd = ["java", "-Xmx1g", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", cp, *args]
        return out(cmd) if capture else subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, text=True)

    def fill(self):
        a = self.a
        self.kafka("topics", "--create", "--topic", TOPIC, "--partitions", str(a.partitions),
                   "--replication-factor", "1")
        self.keyfile = self.work / "keys.tsv"
        log(f"pre-filling {a.records:,} records over {a.keys:,} keys, {a.partitions} partitions")
        res = json.loads(self.java("bench.Fill", "fill", f"bootstrap={self.bootstrap}", f"topic={TOPIC}",
                                   f"records={a.records}", f"keys={a.keys}", f"partitions={a.partitions}",
                                   f"keyfile={self.keyfile}", f"sample={a.sample}", "seed=1").strip().splitlines()[-1])
        log(f"pre-fill: {res['rps']:,.0f} records/s (Java producer)")
        self.prefill_rps = res["rps"]
        self.end = self.end_offsets()
        if sum(self.end.values()) != a.records:
            die(f"topic holds {sum(self.end.values())} records, expected {a.records}")
        self.keys = [line.split("\t") for line in self.keyfile.read_text().splitlines()]
        self.present = [k for k, p, pr in self.keys if pr == "1"]
        # One present key per partition: "answers correctly" means every partition serves.
        self.probes = {}
        for k, p, pr in self.keys:
            if pr == "1" and int(p) not in self.probes:
                self.probes[int(p)] = k
        self.samples = [k for k, p, pr in self.keys[:300]]

    def end_offsets(self, topic=TOPIC):
        text = self.kafka("get-offsets", "--topic", topic)
        res = {}
        for line in text.split():
            t, p, o = line.rsplit(":", 2)
            res[int(p)] = int(o)
        return res

    # -- figures ----------------------------------------------------------------------

    def ingest(self, sysm, rep, record=True):
        """Empty state -> every partition's position at the end offset; then the key count.
        With record=False the table is only built, for the sections that read it."""
        shutil.rmtree(sysm.state, ignore_errors=True)
        app = f"bench-{sysm.name}-{rep}-{int(time.time())}"
        total = sum(self.end.values())
        t_start = time.monotonic()
        proc = sysm.start(app_id=app)
        first = None
        last_sum = 0
        while True:
            if not proc.alive():
                die(f"{sysm.name} exited during ingest (log: {proc.logfile})")
            pos = sysm.positions()
            now = time.monotonic()
            if pos:
                s = sum(min(pos.get(p, 0), e) for p, e in self.end.items())
                if first is None and s > 0:
                    first = (now, s, proc.cpu())
                if all(pos.get(p, 0) >= e for p, e in self.end.items()):
                    break
                last_sum = s
            if now - t_start > 3600:
                die(f"{sysm.name} did not catch up within an hour ({last_sum}/{total})")
            time.sleep(0.05)
        t_done, cpu_done = time.monotonic(), proc.cpu()
        t0, s0, c0 = first
        span = t_done - t0
        records = total - s0
        if span <= 0 or records <= 0:
            # Caught up before the first poll saw progress: fall back to process start.
            span, records, c0 = t_done - t_start, total, 0.0
        rps = records / span
        cpu_per_m = (cpu_done - c0) / records * 1e6
        n = sysm.count()
        if n != self.a.keys:
            die(f"{sysm.name}: key count {n}, expected {self.a.keys}")
        log(f"{sysm.name} ingest #{rep}: {rps:,.0f} records/s, {cpu_per_m:.2f} CPU-s per M records, "
            f"{t_done - t_start:.1f}s from process start to lag 0, {n:,} keys")
        if record:
            self.rec("ingest_rps", sysm.label, rps)
            self.rec("ingest_cpu_s_per_m", sysm.label, cpu_per_m)
            self.rec("ingest_wall_s", sysm.label, t_done - t_start)

    def raw_consume(self, rep):
        res = out_json([TOOLS / "rawconsume", self.bootstrap, TOPIC, self.a.partitions, sum(self.end.values())])
        log(f"raw consume #{rep}: {res['rps']:,.0f} records/s, "
            f"{res['cpu_s'] / res['records'] * 1e6:.2f} CPU-s per M records")
        self.rec("ingest_rps", "limit", res["rps"])
        self.rec("ingest_cpu_s_per_m", "limit", res["cpu_s"] / res["records"] * 1e6)

    def store_write_limit(self, rep):
        """kstate's storage layer writing the same records in ingest's batches, one writer,
        no Kafka: the ceiling of ingest on this machine."""
        d = self.work / "store-writes"
        shutil.rmtree(d, ignore_errors=True)
        total = sum(self.end.values())
        res = out_json([BUILD / "store_writes", d, total, self.a.keys, self.a.partitions])
        shutil.rmtree(d, ignore_errors=True)
        log(f"store writes #{rep}: {res['rps']:,.0f} records/s, "
            f"{res['cpu_s'] / res['records'] * 1e6:.2f} CPU-s per M records")
        self.rec("ingest_rps", "limit_store_write", res["rps"])
        self.rec("ingest_cpu_s_per_m", "limit_store_write", res["cpu_s"] / res["records"] * 1e6)

    def warm_up(self, sysm):
        self.wrk(sysm.port, "wrk_keys.lua", [self.keyfile, STORE, "uniform", "9"], duration=self.a.warmup)

    def wrk(self, port, script, args, proc=None, duration=None, conns=64):
        duration = duration or self.a.duration
        c0 = proc.cpu() if proc else None
        text = out(["wrk", "-t2", f"-c{conns}", f"-d{max(1, round(duration))}s", "--latency", "-s", BD / script,
                    f"http://127.0.0.1:{port}", "--", *args])
        c1 = proc.cpu() if proc else None
        m = re.search(r"(\d+) requests in ([\d.]+)(\w+)", text)
        reqs = int(m.group(1))
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
        errors = re.search(r"Socket errors: (.*)", text)
        lat = {}
        for pct, val, unit in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", text, re.M):
            lat[pct] = float(val) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
        res = {"rps": rps, "requests": reqs, "non2xx": int(non2xx.group(1)) if non2xx else 0,
               "p50_ms": lat.get("50"), "p99_ms": lat.get("99")}
        if errors:
            res["socket_errors"] = errors.group(1)
        if proc:
            res["cpu_us"] = (c1 - c0) / reqs * 1e6 if reqs else None
        return res

    def lookups(self, sysm):
        """Lookups (uniform, skewed), batches and range pages. The baseline is measured on
        each of its front ends; its figure is the better of the two, figure by figure."""
        if sysm.label == "kstate":
            self.lookups_on(sysm.port, sysm.proc, sysm.name, sysm.label)
            self.batch_gets(sysm)
        else:
            for fe in sysm.FRONT_ENDS:
                self.lookups_on(sysm.front_end_port(fe), sysm.proc, f"{sysm.name} ({fe})", f"{sysm.label}_{fe}")
            self.best_front_end(sysm)
        peak, cur = sysm.proc.mem()
        log(f"{sysm.name}: RSS peak {peak:.0f} MiB, steady {cur:.0f} MiB")
        self.rec("rss_mb", sysm.label, cur)
        self.rec("rss_peak_mb", sysm.label, peak)

    def lookups_on(self, port, proc, name, label):
        log(f"{name}: warm-up")
        self.wrk(port, "wrk_keys.lua", [self.keyfile, STORE, "uniform", "9"], duration=self.a.warmup)
        for rep in range(self.a.repeats):
            for mode, fig in (("uniform", "lookup_rps"), ("zipf", "lookup_zipf_rps")):
                r = self.wrk(port, "wrk_keys.lua", [self.keyfile, STORE, mode, str(rep + 1)], proc)
                log(f"{name} lookups {mode} #{rep}: {r['rps']:,.0f} req/s, {r['cpu_us']:.1f} CPU-us/req, "
                    f"404 {r['non2xx'] / r['requests']:.2%}, wrk p99 {r['p99_ms']} ms"
                    + (f", socket errors {r['socket_errors']}" if "socket_errors" in r else ""))
                self.rec(fig, label, r["rps"])
                self.rec(fig.replace("rps", "404_ratio"), label, r["non2xx"] / r["requests"])
                if mode == "uniform":
                    self.rec("lookup_cpu_us", label, r["cpu_us"])
                    self.rec("lookup_wrk_p99_ms", label, r["p99_ms"])
            for limit in (10, 100):
                r = self.wrk(port, "wrk_path.lua", [f"/v1/stores/{STORE}/keys?limit={limit}"], proc)
                if r["non2xx"]:
                    die(f"{name}: range limit={limit} answered {r['non2xx']} non-2xx")
                log(f"{name} range limit={limit} #{rep}: {r['rps']:,.0f} scans/s, {r['cpu_us']:.1f} CPU-us/scan")
                self.rec(f"range{limit}_rps", label, r["rps"])
                self.rec(f"range{limit}_cpu_us", label, r["cpu_us"])

    def batch_gets(self, sysm, keys=100):
        """POST keys:batchGet with `keys` uniformly drawn keys per request."""
        for rep in range(self.a.repeats):
            r = self.wrk(sysm.port, "wrk_batch.lua", [self.keyfile, STORE, str(keys), str(rep + 31)], sysm.proc)
            if r["non2xx"]:
                die(f"{sysm.name}: batchGet answered {r['non2xx']} non-2xx")
            log(f"{sysm.name} batchGet of {keys} keys #{rep}: {r['rps']:,.0f} batches/s, "
                f"{r['cpu_us'] / keys:.2f} CPU-us per key")
            self.rec("batch_get_keys_per_s", sysm.label, r["rps"] * keys)
            self.rec("batch_get_cpu_us_per_key", sysm.label, r["cpu_us"] / keys)

    def best_front_end(self, sysm):
        """Copies, figure by figure, the samples of the baseline's better front end to
        its own label: the figure kstate is compared with."""
        lower_is_better = {"lookup_cpu_us", "lookup_wrk_p99_ms", "range10_cpu_us", "range100_cpu_us"}
        self.front_end = {}
        for fig in ("lookup_rps", "lookup_zipf_rps", "lookup_cpu_us", "lookup_wrk_p99_ms", "range10_rps",
                    "range100_rps", "range10_cpu_us", "range100_cpu_us", "lookup_404_ratio", "lookup_zipf_404_ratio"):
            meds = {fe: statistics.median(self.r[fig][f"{sysm.label}_{fe}"]) for fe in sysm.FRONT_ENDS}
            if fig.endswith("404_ratio"):
                best = self.front_end.get(fig.replace("404_ratio", "rps"), sysm.FRONT_ENDS[0])
            else:
                pick = min if fig in lower_is_better else max
                best = pick(meds, key=meds.get)
            self.front_end[fig] = best
            self.r[fig][sysm.label] = list(self.r[fig][f"{sysm.label}_{best}"])
        log(f"{sysm.name}: better front end per figure: {self.front_end}")

    def fixed_rate(self, sysm, rate):
        """p50/p99/p99.9 at a fixed offered rate (h2load --rps, HTTP/1.1, 32 connections);
        the baseline on its front end with the higher lookup rate."""
        port = sysm.port
        if sysm.label != "kstate":
            port = sysm.front_end_port(self.front_end["lookup_rps"])
        self.fixed_rate_on(port, rate, sysm.name, sysm.label, sysm.key_path)

    def fixed_rate_on(self, port, rate, name, label, key_path):
        conns = 32
        uris = self.work / f"uris-{name}.txt"
        rnd = random.Random(5)
        keys = [k for k, p, pr in self.keys]
        rnd.shuffle(keys)
        uris.write_text("".join(f"http://127.0.0.1:{port}{key_path(k)}\n" for k in keys))
        for rep in range(self.a.repeats):
            logf = self.work / f"h2load-{name}-{rep}.log"
            text = out(["h2load", "--h1", "-t1", f"-c{conns}", f"--rps={rate / conns:.3f}", f"-D{max(1, round(self.a.duration))}",
                        "-i", uris, f"--log-file={logf}"])
            lat, n404, bad = [], 0, 0
            for line in logf.read_text().splitlines():
                f = line.split("\t")
                if len(f) < 3:
                    continue
                st = int(f[1])
                if st == 404:
                    n404 += 1
                elif st != 200 and label != "limit":
                    bad += 1
                lat.append(int(f[2]) / 1000.0)
            lat.sort()
            if not lat:
                die(f"h2load against {name} logged no requests:\n{text}")

            def q(x):
                return lat[min(len(lat) - 1, int(x * len(lat)))]

            achieved = len(lat) / self.a.duration
            log(f"{name} at {rate:,.0f} req/s offered (#{rep}): achieved {achieved:,.0f}, p50 {q(.5):.3f} ms, "
                f"p99 {q(.99):.3f} ms, p99.9 {q(.999):.3f} ms, 404 {n404 / len(lat):.2%}, other errors {bad}")
            if bad:
                die(f"{name}: {bad} answers neither 200 nor 404 at the fixed rate")
            self.rec("lookup_p50_ms", label, q(.5))
            self.rec("lookup_p99_ms", label, q(.99))
            self.rec("lookup_p999_ms", label, q(.999))
            self.rec("fixed_rate_404_ratio", label, n404 / len(lat))

    def answers(self, sysm, keys, port=None):
        res = {}
        for k in keys:
            st, body = get(port or sysm.port, sysm.key_path(k))
            res[k] = (st, body)
        return res

    def check_same_bytes(self, ks_answers, st_answers, other="Kafka Streams"):
        diff = [k for k in ks_answers if ks_answers[k] != st_answers[k]]
        if diff:
            k = diff[0]
            die(f"{other} and kstate answer differently for {len(diff)} of {len(ks_answers)} keys, e.g. {k}:\n"
                f"  kstate: {ks_answers[k]}\n  {other}: {st_answers[k]}")
        n404 = sum(1 for v in ks_answers.values() if v[0] == 404)
        log(f"{other}: byte-identical answers for {len(ks_answers)} keys ({n404} of them 404)")

    def restart(self, sysm, how, fig, guarantee=None):
        """Stop (SIGTERM / SIGKILL / SIGTERM then delete the state), start, time to the first
        moment every partition's probe key answers exactly as before."""
        expected = self.answers(sysm, self.probes.values())
        if any(v[0] != 200 for v in expected.values()):
            die(f"{sysm.name}: probe keys do not answer 200 before the restart: {expected}")
        sysm.stop(signal.SIGKILL if how == "kill9" else signal.SIGTERM)
        if how == "empty":
            shutil.rmtree(sysm.state, ignore_errors=True)
        t0 = time.monotonic()
        if guarantee:
            proc = sysm.start(guarantee=guarantee)
        else:
            proc = sysm.start()
        pending = dict(expected)

        def ok():
            for k in list(pending):
                if (get(sysm.port, sysm.key_path(k), timeout=2)) == pending[k]:
                    del pending[k]
            return not pending

        wait_until(ok, 3600, f"{sysm.name} to answer after restart ({how})", proc, step=0.02)
        dt = time.monotonic() - t0
        log(f"{sysm.name} restart after {how}{' (' + guarantee + ')' if guarantee else ''}: "
            f"first correct answers after {dt:.2f}s")
        self.rec(fig, sysm.label, dt)
        if how == "empty":
            # The rebuild's rate over the whole topic, against the raw consume rate.
            self.rec("restart_empty_rps", sysm.label, self.a.records / dt)
            if "limit" in self.r.get("ingest_rps", {}):
                self.r.setdefault("restart_empty_rps", {})["limit"] = list(self.r["ingest_rps"]["limit"])

    def wait_caught_up(self, sysm, what):
        end = self.end_offsets()
        wait_until(lambda: (lambda p: p and all(p.get(k, 0) >= v for k, v in end.items()))(sysm.positions()),
                   3600, f"{sysm.name} to catch up ({what})", sysm.proc, step=0.1)

    def during_ingest(self, sysm):
        rate = self.a.append_rate
        for rep in range(self.a.repeats):
            seconds = self.a.duration + 3
            prod = self.java("bench.Fill", "append", f"bootstrap={self.bootstrap}", f"topic={TOPIC}",
                             f"keys={self.a.keys}", f"rate={rate}", f"seconds={seconds}",
                             f"seed={100 + rep}", f"seq0={10**9 + rep * 10**7}", capture=False)
            time.sleep(2)
            r = self.wrk(sysm.port, "wrk_keys.lua", [self.keyfile, STORE, "uniform", str(rep + 11)], sysm.proc)
            res = json.loads(prod.communicate()[0].strip().splitlines()[-1])
            log(f"{sysm.name} lookups while appending {res['rps']:,.0f} records/s #{rep}: {r['rps']:,.0f} req/s, "
                f"{r['cpu_us']:.1f} CPU-us/req (includes ingest)")
            self.rec("lookup_rps_during_ingest", sysm.label, r["rps"])
            self.wait_caught_up(sysm, "after appends")

    def during_full_ingest(self, sysm):
        """Lookups while the system ingests a backlog at full speed: paused (SIGSTOP) while
        the backlog is appended, resumed, and looked up from while it catches up."""
        # Long enough to outlast the lookups at full speed, short enough to produce well
        # within the systems' session timeouts (45 s) while they are stopped.
        backlog = min(3 * self.a.records, 10_000_000)
        for rep in range(self.a.repeats):
            before = self.end_offsets()
            os.kill(sysm.proc.pid, signal.SIGSTOP)
            try:
                self.java("bench.Fill", "burst", f"bootstrap={self.bootstrap}", f"topic={TOPIC}",
                          f"keys={self.a.keys}", f"records={backlog}", f"seed={200 + rep}",
                          f"seq0={2 * 10**9 + rep * 10**8}")
            finally:
                os.kill(sysm.proc.pid, signal.SIGCONT)
            after = self.end_offsets()
            r = self.wrk(sysm.port, "wrk_keys.lua", [self.keyfile, STORE, "uniform", str(rep + 21)], sysm.proc)
            pos = sysm.positions() or {}
            applied = sum(min(pos.get(p, 0), e) - before[p] for p, e in after.items())
            caught_up = all(pos.get(p, 0) >= e for p, e in after.items())
            log(f"{sysm.name} lookups during a {backlog:,}-record backlog #{rep}: {r['rps']:,.0f} req/s, "
                f"wrk p99 {r['p99_ms']} ms; {applied:,} records applied meanwhile "
                f"({applied / self.a.duration:,.0f}/s{', caught up before the end' if caught_up else ''})")
            self.rec("lookup_rps_during_full_ingest", sysm.label, r["rps"])
            self.rec("lookup_p99_ms_during_full_ingest", sysm.label, r["p99_ms"])
            self.rec("ingest_rps_during_lookups", sysm.label, applied / self.a.duration)
            self.wait_caught_up(sysm, "after the backlog")

    def wordcount(self):
        from .wordcount import run_wordcount
        run_wordcount(self)

    def join(self):
        from .fkjoin import run_fkjoin
        from .join import run_join
        run_join(self)
        run_fkjoin(self)

    def rocks_limit(self, kstate_state):
        copy = self.work / "state-copy"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(kstate_state, copy)
        res = out_json([BUILD / "rocks_reads", copy, STORE, self.keyfile, 2, self.a.duration / 2, self.cache_mb])
        log(f"RocksDB in-process point reads (2 threads): {res['get_rps']:,.0f} Get/s; "
            f"kstate-like (snapshot + 2 Gets): {res['kstate_like_rps']:,.0f}/s at {res['kstate_like_cpu_us']:.2f} "
            f"CPU-us each")
        self.rec("lookup_rps", "limit_store", res["get_rps"])
        self.rec("lookup_rps", "limit_store_kstate_like", res["kstate_like_rps"])
        self.rec("lookup_cpu_us", "limit_store_kstate_like", res["kstate_like_cpu_us"])
        shutil.rmtree(copy, ignore_errors=True)

    def http_limit(self, body_bytes):
        """The trivial Beast server answering the median answer's bytes: its req/s, its CPU
        per request, and its latency at the fixed rate the systems were measured at. The
        floor of a lookup's CPU is its CPU plus the in-process store read's."""
        port = free_port()
        p = Proc("trivial", [TOOLS / "trivial_server", port, body_bytes, 2], self.work / "trivial.log")
        wait_until(lambda: get(port, "/")[0] == 200, 30, "trivial server", p)
        self.wrk(port, "wrk_keys.lua", [self.keyfile, STORE, "uniform", "9"], duration=self.a.warmup)
        for rep in range(self.a.repeats):
            r = self.wrk(port, "wrk_keys.lua", [self.keyfile, STORE, "uniform", str(rep + 1)], p)
            log(f"trivial Beast server ({body_bytes}-byte body) #{rep}: {r['rps']:,.0f} req/s, "
                f"{r['cpu_us']:.1f} CPU-us/req")
            self.rec("lookup_rps", "limit", r["rps"])
            self.rec("lookup_cpu_us", "limit", r["cpu_us"])
        if getattr(self, "rate", None) and "latency" in self.sections:
            self.fixed_rate_on(port, self.rate, "trivial", "limit", lambda k: f"/v1/stores/{STORE}/keys/{k}")
        p.stop()
        read = self.r.get("lookup_cpu_us", {}).get("limit_store_kstate_like")
        if read:
            floor = statistics.median(self.r["lookup_cpu_us"]["limit"]) + statistics.median(read)
            self.rec("lookup_cpu_us", "limit_floor", floor)
            log(f"floor of a lookup: {floor:.1f} CPU-us (trivial server + in-process read)")

    def forwarded(self, kst):
        """Two kstate instances of one group; lookups of keys the other instance owns."""
        a_state, b_state = self.work / "fwd-a", self.work / "fwd-b"
        shutil.rmtree(a_state, ignore_errors=True)
        shutil.rmtree(b_state, ignore_errors=True)
        shutil.copytree(kst.state, a_state)
        app = kst.app_id
        ka, kb = Kstate(self, "kstate-fwd-a"), Kstate(self, "kstate-fwd-b")
        ka.start(app_id=app, state=a_state, advertised=f"http://127.0.0.1:{ka.port}")
        kb.start(app_id=app, state=b_state, advertised=f"http://127.0.0.1:{kb.port}")
        try:
            def owned(k):
                st, body = get(k.port, f"/v1/stores/{STORE}", timeout=2)
                if st != 200:
                    return None
                parts = json.loads(body).get("assigned_partitions", [])
                return {p["partition"] for p in parts if p.get("ready")}

            def split():
                oa, ob = owned(ka), owned(kb)
                if oa and ob and len(oa) + len(ob) == self.a.partitions and not (oa & ob):
                    return oa, ob
                return None

            oa, ob = wait_until(split, 600, "two kstate instances to split the partitions", step=0.5)
            log(f"instance A owns {sorted(oa)}, B owns {sorted(ob)}")
            remote = [(k, p, pr) for k, p, pr in self.keys if int(p) in ob]
            local = [(k, p, pr) for k, p, pr in self.keys if int(p) in oa]
            k0 = next(k for k, p, pr in remote if pr == "1")
            st, body = get(ka.port, ka.key_path(k0))
            if st != 200:
                self.note(f"forwarded lookups not yet available: a non-owner answers {st} "
                          f"({body[:120].decode(errors='replace')})")
                return None
            files = {}
            for name, ks in (("remote", remote), ("local", local)):
                f = self.work / f"keys-{name}.tsv"
                f.write_text("".join("\t".join(x) + "\n" for x in ks))
                files[name] = f
            self.wrk(ka.port, "wrk_keys.lua", [files["remote"], STORE, "uniform", "9"], duration=self.a.warmup)
            res = {}
            for name in ("remote", "local"):
                vals = [self.wrk(ka.port, "wrk_keys.lua", [files[name], STORE, "uniform", str(r + 1)], ka.proc)["rps"]
                        for r in range(self.a.repeats)]
                res[name] = statistics.median(vals)
            log(f"forwarded lookups: {res['remote']:,.0f} req/s; local on the same instance: {res['local']:,.0f}")
            return res
        finally:
            ka.stop()
            kb.stop()

    # Kafka Streams' ways to move tasks to an instance that joins: at once, restoring there
    # (KIP-924's StickyTaskAssignor), or its default: a warm-up copy on the newcomer, moved
    # by the next probing rebalance once caught up (the shortest interval it allows, and
    # a warm-up for every task at once). Both with kstate's heartbeat interval (0.5 s):
    # every round of a rebalance waits for a heartbeat, and the figure compares copying
    # with restoring, not two heartbeat settings.
    KS_SCALE_OUT = {
        "sticky": ("task_assignor=org.apache.kafka.streams.processor.assignment.assignors.StickyTaskAssignor",
                   "heartbeat_ms=500"),
        "warmup": ("probing_ms=60000", "warmups=100", "heartbeat_ms=500"),
    }

    def scale_out_time(self, first, second, start_second, local_ok):
        """Starts `second` beside `first` (which answers every partition), returns the
        seconds until `second` answers, from its own state, exactly what `first` did for
        the probe key of half the partitions (its share)."""
        expected = {}
        for p, k in self.probes.items():
            st, body = get(first.port, first.key_path(k))
            if st != 200:
                die(f"{first.name}: probe key {k} answers {st} before the scale-out")
            expected[p] = json.loads(body)
        t0 = time.monotonic()
        proc = start_second()
        share = self.a.partitions // 2

        def ready():
            n = 0
            for p, k in self.probes.items():
                st, body = get(second.port, second.key_path(k), timeout=2)
                if st == 200 and local_ok(json.loads(body), expected[p]):
                    n += 1
            return n >= share

        wait_until(ready, 3600, f"{second.name} to answer its share of the partitions", proc, step=0.05)
        return time.monotonic() - t0

    def scale_out(self, kst, st):
        """bootstrap_new_instance_s: a second instance joins a group whose first instance
        holds the whole table."""
        def same(got, want):
            return all(got.get(f) == want.get(f) for f in ("key", "value", "offset", "partition"))

        for rep in range(self.a.empty_repeats):
            a_state, b_state = self.work / "scale-a", self.work / "scale-b"
            for d in (a_state, b_state):
                shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(kst.state, a_state)
            app = f"{kst.app_id}-scale{rep}"
            ka, kb = Kstate(self, "kstate-scale-a"), Kstate(self, "kstate-scale-b")
            # The copy's positions are where it stands: a new group resumes from them.
            ka.start(app_id=app, state=a_state, advertised=f"http://127.0.0.1:{ka.port}")
            try:
                self.wait_caught_up(ka, "scale-out, first instance")
                wait_until(lambda: all(get(ka.port, ka.key_path(k))[0] == 200 for k in self.probes.values()), 600,
                           "kstate (first instance) to answer", ka.proc)
                b_url = f"http://127.0.0.1:{kb.port}"
                dt = self.scale_out_time(
                    ka, kb, lambda: kb.start(app_id=app, state=b_state, advertised=b_url),
                    lambda got, want: got.get("served_by") == b_url and same(got, want))
                log(f"kstate scale-out #{rep}: the newcomer answers its partitions after {dt:.2f} s")
                self.rec("bootstrap_new_instance_s", "kstate", dt)
            finally:
                ka.stop()
                kb.stop()

        for rep in range(self.a.empty_repeats):
            times = {}
            for variant, extra in self.KS_SCALE_OUT.items():
                app = f"{st.app_id}-scale-{variant}{rep}"
                sa, sb = Streams(self, "streams-scale-a"), Streams(self, "streams-scale-b")
                for s_ in (sa, sb):
                    shutil.rmtree(s_.state, ignore_errors=True)
                sa.start(app_id=app, instance=1, extra=extra)
                try:
                    self.wait_caught_up(sa, f"scale-out ({variant}), first instance")
                    wait_until(lambda: all(get(sa.port, sa.key_path(k))[0] == 200 for k in self.probes.values()),
                               600, "Kafka Streams (first instance) to answer", sa.proc)
                    times[variant] = self.scale_out_time(
                        sa, sb, lambda: sb.start(app_id=app, instance=2, extra=extra), same)
                    log(f"Kafka Streams scale-out ({variant}) #{rep}: the newcomer answers its partitions after "
                        f"{times[variant]:.2f} s")
                finally:
                    sa.stop()
                    sb.stop()
            self.r.setdefault("bootstrap_new_instance_ks_variants", {}).setdefault("sticky", []).append(
                times["sticky"])
            self.r["bootstrap_new_instance_ks_variants"].setdefault("warmup", []).append(times["warmup"])
            # Compared with the faster way.
            self.rec("bootstrap_new_instance_s", "kafka_streams", min(times.values()))

    def cleanup(self):
        for p in list(ALL):
            try:
                p.stop(signal.SIGKILL, timeout=30)
            except Exception:  # best effort at exit
                pass
        try:
            run([ROOT / "scripts" / "kafka", "stop"], env=self.env, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, check=False)
        finally:
            shutil.rmtree(self.kafka_run, ignore_errors=True)
            if self.a.keep:
                log(f"kept {self.work}")
            else:
                shutil.rmtree(self.work, ignore_errors=True)
