"""The systems under test: kstate and the Kafka Streams baseline, started and probed alike."""
import json
import signal
import time

from .common import ADVERTISED, BD, BUILD, STORE, TOPIC, Proc, die, free_port, get

class System:
    label = ""

    def __init__(self, h, name):
        self.h = h
        self.name = name
        self.port = free_port()
        self.proc = None
        self.state = h.work / f"{name}-state"
        self.app_id = None

    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def key_path(self, key):
        return f"/v1/stores/{STORE}/keys/{key}"

    def stop(self, sig=signal.SIGTERM):
        if self.proc:
            self.proc.stop(sig)
            self.proc = None


class Kstate(System):
    label = "kstate"

    def start(self, app_id=None, state=None, port=None, advertised=ADVERTISED):
        self.app_id = app_id or self.app_id
        if state:
            self.state = state
        if port:
            self.port = port
        cfg = self.h.work / f"{self.name}.yaml"
        cfg.write_text(f"""application_id: {self.app_id}
bootstrap_servers: {self.h.bootstrap}
state_dir: {self.state}
advertised_endpoint: {advertised}
http:
  listen: 127.0.0.1:{self.port}
query:
  exact_count_limit: 1000000000
views:
  - name: {STORE}
    topic: {TOPIC}
    key_format: string
    value_format: json
    partitioner: murmur2
""")
        extra = [arg for kv in (self.h.a.kstate_set or []) for arg in ("--set", kv)]
        self.proc = Proc(self.name, [BUILD / "server" / "kstate", "--config", cfg, "--log-level", "warn", *extra],
                         self.h.work / f"{self.name}.log")
        return self.proc

    def positions(self):
        st, body = get(self.port, f"/v1/stores/{STORE}", timeout=2)
        if st != 200:
            return None
        d = json.loads(body)
        return {int(p): int(o) for p, o in d.get("position", {}).items()}

    def count(self):
        # 503 until every partition is marked ready (its EOF seen), shortly after lag 0.
        st, body = None, b""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st, body = get(self.port, f"/v1/stores/{STORE}/count", timeout=120)
            if st != 503:
                break
            time.sleep(0.05)
        if st != 200:
            die(f"kstate count answered {st}: {body[:300]!r}")
        return json.loads(body)["count"]


class Streams(System):
    """The baseline answers on two front ends at once: the JDK's HTTP server on `port`
    and Vert.x (an event loop per core) on `vertx_port`."""
    label = "kafka_streams"
    # The front ends, by the label suffix their figures are recorded under.
    FRONT_ENDS = ("jdk", "vertx")

    def __init__(self, h, name):
        super().__init__(h, name)
        self.vertx_port = free_port()

    def front_end_port(self, front_end):
        return self.vertx_port if front_end == "vertx" else self.port

    def start(self, app_id=None, guarantee="at_least_once", instance=1, extra=()):
        """`instance`: the group.instance.id suffix (one per instance of a group); `extra`:
        more key=value arguments of bench.Baseline (task_assignor, probing_ms, warmups)."""
        self.app_id = app_id or self.app_id
        cp = f"{BD / 'streams/target/classes'}:{BD / 'streams/target/lib'}/*"
        cmd = ["java", "-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               # TCP_NODELAY on the JDK server's sockets: without it, Nagle's algorithm and
               # the client's delayed ACKs hold every keep-alive answer for ~40 ms.
               "-Dsun.net.httpserver.nodelay=true",
               "-cp", cp, "bench.Baseline",
               f"bootstrap={self.h.bootstrap}", f"topic={TOPIC}", f"store={STORE}", f"app_id={self.app_id}",
               f"state_dir={self.state}", f"port={self.port}", f"vertx_port={self.vertx_port}",
               f"advertised={ADVERTISED}",
               f"partitions={self.h.a.partitions}", "stream_threads=2", "http_threads=4",
               f"guarantee={guarantee}", f"cache_mb={self.h.cache_mb}", "static_membership=1",
               f"instance={instance}", *extra]
        self.proc = Proc(self.name, cmd, self.h.work / f"{self.name}.log")
        return self.proc

    def positions(self):
        st, body = get(self.port, "/bench/status", timeout=2)
        if st != 200:
            return None
        d = json.loads(body)
        return {int(p): int(o) for p, o in d["position"].items()}

    def count(self):
        st, body = get(self.port, "/bench/count", timeout=300)
        if st != 200:
            die(f"Kafka Streams count answered {st}: {body[:300]!r}")
        return json.loads(body)["count"]
