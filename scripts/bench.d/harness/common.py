"""What every part of scripts/bench shares: paths, logging, processes under test, HTTP GET."""
import json
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BD = ROOT / "scripts" / "bench.d"
BUILD = ROOT / "build-release"
TOOLS = BUILD / "bench"
STORE = "bench"
TOPIC = "bench"
ADVERTISED = "http://bench.local:8080"  # served_by of both systems, so answers compare byte for byte
CLK_TCK = os.sysconf("SC_CLK_TCK")

def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def die(msg):
    log("FAILED: " + msg)
    sys.exit(1)


def run(cmd, **kw):
    kw.setdefault("check", True)
    return subprocess.run([str(c) for c in cmd], **kw)


def out(cmd, **kw):
    return run(cmd, capture_output=True, text=True, **kw).stdout


def out_json(cmd, **kw):
    """The JSON object a limit tool prints as its last line of the form {...}: the store
    tools share kstate's storage logger, which may print RocksDB's warnings (a write
    stall) to standard output before it."""
    lines = [ln for ln in out(cmd, **kw).splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"{cmd[0]} printed no JSON result")
    return json.loads(lines[-1])


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def load():
    return os.getloadavg()


def median_spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.median(xs), (min(xs), max(xs))


# ---- processes ----------------------------------------------------------------------

class Proc:
    """A server under test: its CPU time and memory from /proc."""

    def __init__(self, name, cmd, logfile, env=None):
        self.name = name
        self.logfile = logfile
        self.log = open(logfile, "ab")
        self.started = time.monotonic()
        self.p = subprocess.Popen([str(c) for c in cmd], stdout=self.log, stderr=subprocess.STDOUT,
                                  env=env, start_new_session=True)
        ALL.append(self)

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def cpu(self):
        """user + system CPU seconds of the whole process (all threads)."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def mem(self):
        """(peak RSS, current RSS) in MiB."""
        vals = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS"):
                    vals[k] = int(v.split()[0]) / 1024
        return vals["VmHWM"], vals["VmRSS"]

    def stop(self, sig=signal.SIGTERM, timeout=120):
        if not self.alive():
            return self.p.returncode
        self.p.send_signal(sig)
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.name} did not stop in {timeout}s after {sig!r}: killing")
            self.p.kill()
            self.p.wait()
        self.log.close()
        if self in ALL:
            ALL.remove(self)
        return self.p.returncode


ALL = []


def kstate_proc(h, app, state, port, views):
    """A kstate process of application `app` (exactly once, state in `state`, HTTP on
    127.0.0.1:`port`) serving `views`, the YAML lines under `views:`."""
    cfg = h.work / f"{app}.yaml"
    cfg.write_text(f"""application_id: {app}
bootstrap_servers: {h.bootstrap}
state_dir: {state}
processing_guarantee: exactly_once
http:
  listen: 127.0.0.1:{port}
views:
{views}""")
    return Proc(app, [BUILD / "server" / "kstate", "--config", cfg, "--log-level", "warn"], h.work / f"{app}.log")


def get(port, path, timeout=10):
    """(status, body bytes) or (None, b'') when the server does not answer."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, body
    except (OSError, http.client.HTTPException):
        return None, b""


def wait_until(pred, timeout, what, proc=None, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            die(f"{proc.name} exited while waiting for {what} (log: {proc.logfile})")
        v = pred()
        if v:
            return v
        time.sleep(step)
    die(f"timed out after {timeout}s waiting for {what}")



def machine():
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    mem = next((int(line.split()[1]) // 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal")), 0)
    return {"nproc": os.cpu_count(), "cpu": cpu, "mem_mib": mem, "kernel": os.uname().release}

