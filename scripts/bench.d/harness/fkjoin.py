"""The foreign-key join of scripts/bench's join section: orders joined with the customer
each order names by its member customer.id, inner and left, by two kstate join views
with join.foreign_key (exactly_once) and by Kafka Streams' foreign-key joins (KIP-213,
KTable#join(other, foreignKeyExtractor, joiner) and #leftJoin; bench.Join with
foreign_key=customer.id, exactly_once_v2) on the same input. The two topics have
different partition counts (6 and 3 by default): a foreign-key join does not need them
co-partitioned.

Every row of both joins, read once a system has consumed everything, is compared as
parsed JSON: kstate's with the joins computed here from the generator's last values of
both tables, and each Kafka Streams run's with kstate's. Kafka Streams runs with its
default record cache (its differing rows counted by kind and shown, as for the key
joins) and once with the cache off, which must be identical but for one kind of
inner-join row that Kafka Streams keeps (retained()), counted and shown."""
import json
import urllib.parse

from . import join
from .common import die, get, kstate_proc, log

ORDERS, CUSTOMERS = "fk-orders", "fk-customers"
FOREIGN_KEY = "customer.id"
TYPES = ("inner", "left")
VIEW_PREFIX = "fk_"


def named_customer(order):
    """The customer key an order names, as docs/fk-joins.md defines it: a string is the
    key, a number its JSON text; anything else (missing, null, a boolean, an object, an
    array, or no object to look in) names none."""
    v = order
    for member in FOREIGN_KEY.split("."):
        if not isinstance(v, dict) or member not in v:
            return None
        v = v[member]
    if isinstance(v, bool) or v is None:  # bool before int: True is an int in Python
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return json.dumps(v)
    return None


def expected_joins(statefile):
    """{type: {order key: joined value}} from the generator's last values of both tables,
    and how many orders name no customer and name one that does not exist."""
    orders, customers = {}, {}
    for line in statefile.read_text(encoding="utf-8").splitlines():
        table, key, value = line.split("\t")
        (orders if table == "O" else customers)[key] = json.loads(value)
    want = {t: {} for t in TYPES}
    counts = {"orders": len(orders), "customers": len(customers), "naming_none": 0, "naming_absent": 0}
    for key, order in orders.items():
        fk = named_customer(order)
        customer = customers.get(fk) if fk is not None else None
        if fk is None:
            counts["naming_none"] += 1
        elif customer is None:
            counts["naming_absent"] += 1
        if customer is not None:
            want["inner"][key] = {"left": order, "right": customer}
        want["left"][key] = {"left": order, "right": customer}
    return want, counts


# ---- kstate ---------------------------------------------------------------------------

def start_kstate(h, app, state, port):
    views = "".join(f"""  - name: {VIEW_PREFIX}{t}
    kind: join
    topic: {ORDERS}
    key_format: string
    join: {{type: {t}, right: {CUSTOMERS}, foreign_key: {FOREIGN_KEY}}}
""" for t in TYPES)
    return kstate_proc(h, app, state, port, views)


def matched(status, body, unwrap):
    """Whether a marker's row is there and holds its customer (a left join shows the row
    with a null customer until the customer's answer arrives)."""
    if status != 200:
        return False
    value = json.loads(body)
    return (value["value"] if unwrap else value)["right"] is not None


def kstate_has(port, t, key):
    st, body = get(port, f"/v1/stores/{VIEW_PREFIX}{t}/keys/{urllib.parse.quote(key, safe='')}", timeout=5)
    return matched(st, body, unwrap=True)


def kstate_rows(port, t):
    return join.kstate_rows(port, t, VIEW_PREFIX)


# ---- Kafka Streams --------------------------------------------------------------------

def start_streams(h, app, state, port, extra=()):
    return join.start_streams(h, app, state, port, (f"foreign_key={FOREIGN_KEY}", *extra), ORDERS, CUSTOMERS)


def start_streams_no_cache(h, app, state, port):
    return start_streams(h, app, state, port, ("record_cache_bytes=0",))


def streams_has(port, t, key):
    st, body = get(port, f"/bench/key/{t}/{urllib.parse.quote(key, safe='')}", timeout=5)
    return matched(st, body, unwrap=False)


SYSTEMS = {"kstate": (start_kstate, kstate_has, kstate_rows),
           "kafka_streams": (start_streams, streams_has, join.streams_rows),
           "kafka_streams_no_cache": (start_streams_no_cache, streams_has, join.streams_rows)}


# ---- the section ----------------------------------------------------------------------

RETAINED = "an older value of an order whose last value joins no customer or is deleted"


def retained(row, last):
    """Whether an inner-join row the input's join lacks holds an older value of an order
    whose last value (`last`, its left-join row; None: deleted) joins no customer.
    Kafka Streams keeps such a row when the answer that would delete it comes back after
    the order changed again: it drops answers for a value the order no longer has (a hash
    of the order), and in an inner join the order's later values send nothing that could
    delete the row (a value naming no customer, a tombstone after one) or are answered
    only if their customer exists (a new order, an unchanged customer). kstate applies
    the answer of the row's current subscription, which comes with or without a
    customer, and a tombstone or a value naming no customer removes the row at once."""
    return last is None or (last["right"] is None and row["left"] != last["left"])


def run_fkjoin(h):
    a = h.a
    right_partitions = max(1, a.partitions // 2)
    h.kafka("topics", "--create", "--topic", ORDERS, "--partitions", str(a.partitions), "--replication-factor", "1")
    h.kafka("topics", "--create", "--topic", CUSTOMERS, "--partitions", str(right_partitions),
            "--replication-factor", "1")
    statefile = h.work / "fk-join-tables.tsv"
    log(f"producing {a.join_records:,} orders over {a.join_keys:,} keys ({a.partitions} partitions) and "
        f"{a.join_records:,} customer records ({right_partitions} partitions)")
    res = json.loads(h.java("bench.Fill", "fkjoin", f"bootstrap={h.bootstrap}", f"left={ORDERS}",
                            f"right={CUSTOMERS}", f"records={a.join_records}", f"keys={a.join_keys}",
                            f"partitions={a.partitions}", f"right_partitions={right_partitions}",
                            f"statefile={statefile}", "seed=13").strip().splitlines()[-1])
    log(f"foreign-key join input: {res['records']:,} records, {res['rps']:,.0f} records/s (Java producer)")
    total = res["records"]
    want, counts = expected_joins(statefile)
    markers = [k for k in want["inner"] if k.startswith("~end-o")]
    if len(markers) != a.partitions * right_partitions:
        die(f"the generator wrote {len(markers)} order end markers for {a.partitions} x {right_partitions} "
            "partitions")
    rows = {t: len(want[t]) for t in TYPES}
    h.fkjoin_check = {"records_per_side": a.join_records, "order_keys": a.join_keys,
                      "partitions": [a.partitions, right_partitions], "input_records": total, "rows": rows, **counts}

    def run(label, rep):
        return join.measure(h, label, markers, total, rep, SYSTEMS, TYPES, "fkjoin")

    def mismatch(got, against, what):
        for t in TYPES:
            diff = join.differences(got[t], against[t])
            if diff:
                die(f"the foreign-key {t} join of {what} ({len(got[t]):,} rows against {len(against[t]):,}); "
                    f"first differences: " + "; ".join(join.describe(k, r, want[t].get(k)) for k, r, _ in diff))

    kstate = None
    for rep in range(a.join_repeats):
        got = run("kstate", rep)
        mismatch(got, want, "kstate differs from the joins of the input's last values")
        kstate = kstate or got
    log("kstate: every row of the foreign-key inner and left joins equals the joins of the input's last values")

    # Kafka Streams as its users run it, the record cache at its default.
    def kind(t, k, row, w):
        if t == "inner" and w is None and row is not None and retained(row, want["left"].get(k)):
            return RETAINED
        return join.difference_kind(row, w)

    h.fkjoin_check["kafka_streams_differing_rows"] = [
        join.cached_differences(h, "foreign-key join", rep, kstate, run("kafka_streams", rep), want, TYPES, kind)
        for rep in range(a.join_repeats)]

    # With the cache off, every row must be identical but one kind (see retained()),
    # which is counted and shown.
    got = run("kafka_streams_no_cache", 0)
    kept = [k for k in got["inner"].keys() - kstate["inner"].keys() if retained(got["inner"][k], want["left"].get(k))]
    if kept:
        h.note(f"Kafka Streams foreign-key join (record cache off): {len(kept):,} rows, inner: {RETAINED}; e.g. "
               + "; ".join(join.describe(k, got["inner"][k], want["left"].get(k)) for k in sorted(kept)[:3]))
    for k in kept:
        del got["inner"][k]
    mismatch(got, kstate, "Kafka Streams (record cache off) differs from kstate's")
    h.fkjoin_check["kafka_streams_no_cache_retained_inner_rows"] = len(kept)
    h.fkjoin_check["identical_to_kafka_streams_no_cache"] = not kept
    log("foreign-key join: every row of the inner and left joins is identical in kstate and Kafka Streams with "
        f"its record cache off (parsed JSON), but {len(kept):,} retained inner-join rows, and kstate's equal the "
        "joins of the input's last values: " + ", ".join(f"{t} {rows[t]:,} rows" for t in TYPES))
