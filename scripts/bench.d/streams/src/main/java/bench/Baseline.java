package bench;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import io.vertx.core.Vertx;
import io.vertx.core.VertxOptions;
import io.vertx.core.http.HttpServerOptions;
import io.vertx.core.http.HttpServerResponse;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.PriorityQueue;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicReferenceArray;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

/**
 * The Kafka Streams baseline of scripts/bench: one topic as a KTable in RocksDB (the
 * source topic is the changelog: topology.optimization=all), served by Interactive
 * Queries behind the JDK's HTTP server on kstate's URL shapes and with kstate's bytes:
 *
 *   GET /v1/stores/{store}/keys/{key}     200 the same JSON as kstate, 404 problem+json
 *   GET /v1/stores/{store}/keys?limit=N   the first N keys in byte order, all partitions
 *   GET /bench/status                     {"state":..,"position":{"p":next offset,..}}
 *   GET /bench/count                      exact key count (iterates every store)
 *
 * Usage: Baseline key=value... with keys bootstrap, topic, store, app_id, state_dir,
 * port (the JDK server), vertx_port (optional: Vert.x too), advertised, partitions,
 * stream_threads (2), http_threads (4, the JDK server's pool), event_loops (Vert.x: the
 * cores), guarantee (at_least_once | exactly_once_v2), cache_mb (64), static_membership
 * (0 | 1), instance (1: the group.instance.id suffix, one per instance of the group),
 * task_assignor (a task.assignor.class), probing_ms, warmups, heartbeat_ms.
 */
public final class Baseline {
  private static String store;
  private static String served;
  private static int partitions;
  private static KafkaStreams streams;
  private static AtomicReferenceArray<ReadOnlyKeyValueStore<byte[], byte[]>> stores;

  public static void main(String[] argv) throws Exception {
    Map<String, String> a = new HashMap<>();
    for (String s : argv) {
      int eq = s.indexOf('=');
      a.put(s.substring(0, eq), s.substring(eq + 1));
    }
    String topic = a.get("topic");
    store = a.getOrDefault("store", topic);
    served = a.get("advertised");
    partitions = Integer.parseInt(a.get("partitions"));
    stores = new AtomicReferenceArray<>(partitions);

    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, a.get("app_id"));
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
    p.put(StreamsConfig.STATE_DIR_CONFIG, a.get("state_dir"));
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(a.getOrDefault("stream_threads", "2")));
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, a.getOrDefault("guarantee", StreamsConfig.AT_LEAST_ONCE));
    p.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
    p.put(StreamsConfig.ROCKSDB_CONFIG_SETTER_CLASS_CONFIG, BoundedRocks.class);
    p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
    p.put("bench.cache.mb", a.getOrDefault("cache_mb", "64"));
    p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
    if ("1".equals(a.get("static_membership"))) {
      // Static membership: a restarted instance takes its partitions back at once instead
      // of waiting for the group to time the old member out (Kafka Streams does not leave
      // the group on close). What an operator who cares about restart time configures.
      p.put(StreamsConfig.consumerPrefix("group.instance.id"), a.get("app_id") + "-instance-" + a.getOrDefault("instance", "1"));
    }
    // Scale-out: how tasks move to an instance that joins. Either a task assignor class
    // (KIP-924: the StickyTaskAssignor moves tasks at once and restores them there), or
    // the default high-availability assignor, which keeps a task where its state is
    // until a warm-up copy on the newcomer caught up, checked every probing interval.
    if (a.containsKey("task_assignor")) p.put("task.assignor.class", a.get("task_assignor"));
    if (a.containsKey("probing_ms")) p.put(StreamsConfig.PROBING_REBALANCE_INTERVAL_MS_CONFIG, Long.parseLong(a.get("probing_ms")));
    if (a.containsKey("warmups")) p.put(StreamsConfig.MAX_WARMUP_REPLICAS_CONFIG, Integer.parseInt(a.get("warmups")));
    // Each round of a rebalance waits for the members' next heartbeat (3 s by default).
    if (a.containsKey("heartbeat_ms")) p.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), Integer.parseInt(a.get("heartbeat_ms")));

    StreamsBuilder b = new StreamsBuilder();
    b.table(topic, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()),
        Materialized.<byte[], byte[]>as(OffsetStore.supplier(store))
            .withKeySerde(Serdes.ByteArray()).withValueSerde(Serdes.ByteArray())
            .withCachingDisabled());
    Topology topology = b.build(p);  // build(props) applies the source-topic optimization
    streams = new KafkaStreams(topology, p);
    streams.setUncaughtExceptionHandler(e -> {
      e.printStackTrace();
      return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
    });
    streams.setStateListener((now, before) -> {
      for (int i = 0; i < partitions; i++) stores.set(i, null);
    });

    streams.start();
    // The JDK's server (a fixed pool of threads) on `port`, and, with vertx_port, Vert.x
    // (one event loop per core, one HTTP server per loop on the shared port, each
    // answering on its loop: store lookups take microseconds) beside it, both answering
    // from this one KafkaStreams instance.
    HttpServer http = HttpServer.create(new InetSocketAddress("127.0.0.1", Integer.parseInt(a.get("port"))), 1024);
    http.setExecutor(Executors.newFixedThreadPool(Integer.parseInt(a.getOrDefault("http_threads", "4"))));
    http.createContext("/", Baseline::handle);
    http.start();
    Vertx vertx = null;
    if (a.containsKey("vertx_port")) {
      int loops = Integer.parseInt(a.getOrDefault("event_loops", String.valueOf(Runtime.getRuntime().availableProcessors())));
      vertx = Vertx.vertx(new VertxOptions().setEventLoopPoolSize(loops));
      int port = Integer.parseInt(a.get("vertx_port"));
      for (int i = 0; i < loops; i++) {
        vertx.createHttpServer(new HttpServerOptions().setTcpNoDelay(true).setHost("127.0.0.1").setPort(port))
            .requestHandler(req -> {
              Answer ans = answer(req.method().name(), req.path(), req.query());
              HttpServerResponse r = req.response().setStatusCode(ans.status()).putHeader("Content-Type", ans.type());
              if (ans.position() != null) r.putHeader("X-Kstate-Position", ans.position());
              if (ans.retryAfter()) r.putHeader("Retry-After", "1");
              r.end(ans.body());
            })
            .listen()
            .await();
      }
    }
    final Vertx loopsToClose = vertx;
    Runnable stopHttp = () -> {
      http.stop(0);
      if (loopsToClose != null) loopsToClose.close().await();
    };

    CountDownLatch done = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      stopHttp.run();
      streams.close(Duration.ofSeconds(60));
      done.countDown();
    }));
    done.await();
  }

  // ---- HTTP ------------------------------------------------------------------------

  /** One HTTP answer, whichever server sends it. */
  record Answer(int status, String type, String body, String position, boolean retryAfter) {
    static Answer of(int status, String type, String body) { return new Answer(status, type, body, null, false); }
  }

  /** The answer to GET `path`?`query` (raw, percent-encoded), or to another method. */
  static Answer answer(String method, String path, String query) {
    try {
      String prefix = "/v1/stores/" + store + "/keys";
      if (!"GET".equals(method)) {
        return Answer.of(405, "application/problem+json", problem(405, 40501, "method_not_allowed", "Method not allowed", "only GET", path));
      } else if (path.startsWith(prefix + "/")) {
        return getKey(path, path.substring(prefix.length() + 1));
      } else if (path.equals(prefix)) {
        return range(path, query);
      } else if (path.equals("/bench/status")) {
        StringBuilder s = new StringBuilder("{\"state\":\"").append(streams.state()).append("\",\"position\":");
        position(s, -1);
        return Answer.of(200, "application/json", s.append('}').toString());
      } else if (path.equals("/bench/count")) {
        long n = 0;
        for (int i = 0; i < partitions; i++) {
          try (KeyValueIterator<byte[], byte[]> it = storeOf(i).all()) {
            while (it.hasNext()) { it.next(); n++; }
          }
        }
        return Answer.of(200, "application/json", "{\"count\":" + n + "}");
      } else {
        return Answer.of(404, "application/problem+json", problem(404, 40403, "route_not_found", "Route not found", "no route for GET " + path, path));
      }
    } catch (InvalidStateStoreException | NotRunning e) {
      return new Answer(503, "application/problem+json", problem(503, 50301, "not_caught_up", "Partition not caught up", "store not queryable: " + e.getMessage(), path), null, true);
    } catch (RuntimeException e) {
      e.printStackTrace();
      return Answer.of(500, "application/problem+json", problem(500, 50001, "internal", "Internal server error", String.valueOf(e), path));
    }
  }

  private static void handle(HttpExchange ex) throws IOException {
    Answer a = answer(ex.getRequestMethod(), ex.getRequestURI().getRawPath(), ex.getRequestURI().getRawQuery());
    if (a.position() != null) ex.getResponseHeaders().set("X-Kstate-Position", a.position());
    if (a.retryAfter()) ex.getResponseHeaders().set("Retry-After", "1");
    byte[] b = a.body().getBytes(StandardCharsets.UTF_8);
    ex.getResponseHeaders().set("Content-Type", a.type());
    ex.sendResponseHeaders(a.status(), b.length);
    try (OutputStream os = ex.getResponseBody()) {
      os.write(b);
    }
  }

  private static final class NotRunning extends RuntimeException {
    NotRunning(String m) { super(m, null, false, false); }
  }

  private static ReadOnlyKeyValueStore<byte[], byte[]> storeOf(int partition) {
    ReadOnlyKeyValueStore<byte[], byte[]> s = stores.get(partition);
    if (s != null) return s;
    if (streams.state() != KafkaStreams.State.RUNNING) throw new NotRunning("state " + streams.state());
    s = streams.store(StoreQueryParameters.fromNameAndType(store, QueryableStoreTypes.<byte[], byte[]>keyValueStore())
        .withPartition(partition));
    stores.set(partition, s);
    return s;
  }

  private static Answer getKey(String path, String rawKey) {
    byte[] key = percentDecode(rawKey);
    // The producers' partitioner (the Java client's default): what queryMetadataForKey computes.
    int partition = Utils.toPositive(Utils.murmur2(key)) % partitions;
    byte[] v = storeOf(partition).get(key);
    long pos = OffsetStore.position(store, partition);
    StringBuilder s = new StringBuilder(256);
    if (v == null) {
      // kstate's 404: problem fields plus partition, position, served_by; keys sorted.
      s.append("{\"detail\":\"no value for this key in store '");
      escape(s, store);
      s.append("'\",\"error_code\":40402,\"instance\":\"");
      escape(s, new String(percentDecode(path), StandardCharsets.UTF_8));
      s.append("\",\"partition\":").append(partition).append(",\"position\":{\"").append(partition).append("\":")
       .append(pos).append("},\"served_by\":\"");
      escape(s, served);
      s.append("\",\"status\":404,\"title\":\"Key not found\",\"type\":\"/problems/key_not_found\"}");
      return new Answer(404, "application/problem+json", s.toString(), partition + ":" + pos, false);
    }
    long offset = ByteBuffer.wrap(v, 0, 8).getLong();
    s.append("{\"key\":\"");
    escape(s, new String(key, StandardCharsets.UTF_8));
    s.append("\",\"offset\":").append(offset).append(",\"partition\":").append(partition)
     .append(",\"position\":{\"").append(partition).append("\":").append(pos).append("},\"served_by\":\"");
    escape(s, served);
    s.append("\",\"store\":\"");
    escape(s, store);
    // The value is JSON as produced (compact, keys sorted): embedded as it is.
    s.append("\",\"value\":").append(new String(v, 8, v.length - 8, StandardCharsets.UTF_8)).append('}');
    return new Answer(200, "application/json", s.toString(), partition + ":" + pos, false);
  }

  /**
   * The first `limit` keys of the store in key byte order: every partition's store is
   * read from its start (limit + 1 entries each, to tell whether more exist) and the
   * runs are merged. Kafka Streams' ReadOnlyKeyValueStore over all partitions
   * concatenates the partitions' ranges instead of merging them, so an application
   * answering in key order has to do this itself.
   */
  private static Answer range(String path, String query) {
    int limit = 100;
    if (query != null) {
      for (String kv : query.split("&")) {
        if (kv.startsWith("limit=")) limit = Integer.parseInt(kv.substring(6));
      }
    }
    record Entry(byte[] key, byte[] value, int partition) {}
    PriorityQueue<Entry> heap = new PriorityQueue<>((x, y) -> {
      int c = java.util.Arrays.compareUnsigned(x.key, y.key);
      return c != 0 ? c : Integer.compare(x.partition, y.partition);
    });
    for (int i = 0; i < partitions; i++) {
      try (KeyValueIterator<byte[], byte[]> it = storeOf(i).all()) {
        for (int n = 0; n <= limit && it.hasNext(); n++) {
          KeyValue<byte[], byte[]> kv = it.next();
          heap.add(new Entry(kv.key, kv.value, i));
        }
      }
    }
    List<Entry> out = new ArrayList<>(limit);
    while (out.size() < limit && !heap.isEmpty()) out.add(heap.poll());
    boolean more = !heap.isEmpty();
    StringBuilder s = new StringBuilder(160 * limit + 200);
    s.append("{\"data\":[");
    for (int i = 0; i < out.size(); i++) {
      Entry e = out.get(i);
      if (i > 0) s.append(',');
      s.append("{\"key\":\"");
      escape(s, new String(e.key, StandardCharsets.UTF_8));
      s.append("\",\"offset\":").append(ByteBuffer.wrap(e.value, 0, 8).getLong())
       .append(",\"partition\":").append(e.partition).append(",\"value\":")
       .append(new String(e.value, 8, e.value.length - 8, StandardCharsets.UTF_8)).append('}');
    }
    s.append("],\"metadata\":{\"next\":");
    if (more && !out.isEmpty()) {
      s.append('"').append(Base64.getUrlEncoder().withoutPadding().encodeToString(out.get(out.size() - 1).key)).append('"');
    } else {
      s.append("null");
    }
    s.append(",\"position\":");
    position(s, -1);
    s.append("},\"served_by\":\"");
    escape(s, served);
    s.append("\"}");
    return Answer.of(200, "application/json", s.toString());
  }

  private static void position(StringBuilder s, int only) {
    s.append('{');
    for (int i = 0; i < partitions; i++) {
      if (i > 0) s.append(',');
      s.append('"').append(i).append("\":").append(OffsetStore.position(store, i));
    }
    s.append('}');
  }

  private static String problem(int status, int code, String type, String title, String detail, String instance) {
    StringBuilder s = new StringBuilder("{\"detail\":\"");
    escape(s, detail);
    s.append("\",\"error_code\":").append(code).append(",\"instance\":\"");
    escape(s, instance);
    s.append("\",\"status\":").append(status).append(",\"title\":\"").append(title)
     .append("\",\"type\":\"/problems/").append(type).append("\"}");
    return s.toString();
  }

  // nlohmann::json's escaping: quote, backslash, and control characters (short forms where
  // JSON has them, else a six-character hex escape).
  private static void escape(StringBuilder s, String v) {
    for (int i = 0; i < v.length(); i++) {
      char c = v.charAt(i);
      switch (c) {
        case '"': s.append("\\\""); break;
        case '\\': s.append("\\\\"); break;
        case '\b': s.append("\\b"); break;
        case '\f': s.append("\\f"); break;
        case '\n': s.append("\\n"); break;
        case '\r': s.append("\\r"); break;
        case '\t': s.append("\\t"); break;
        default:
          if (c < 0x20) s.append(String.format("\\u%04x", (int) c));
          else s.append(c);
      }
    }
  }

  private static byte[] percentDecode(String s) {
    byte[] out = new byte[s.length()];
    int n = 0;
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == '%' && i + 2 < s.length()) {
        out[n++] = (byte) Integer.parseInt(s.substring(i + 1, i + 3), 16);
        i += 2;
      } else {
        out[n++] = (byte) c;
      }
    }
    return java.util.Arrays.copyOf(out, n);
  }
}
