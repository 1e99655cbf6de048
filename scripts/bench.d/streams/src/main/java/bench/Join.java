package bench;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.function.Function;

import io.vertx.core.json.DecodeException;
import io.vertx.core.json.Json;
import io.vertx.core.json.JsonObject;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

/**
 * The join section of scripts/bench: two tables joined on the key three ways, as a user
 * writes it with the DSL: builder.table() of each topic, then KTable#join, #leftJoin
 * and #outerJoin, each materialized. The ValueJoiner builds kstate's joined value,
 * {"left": L, "right": R}, the JSON values embedded and a missing side null. Exactly
 * once (exactly_once_v2), the record cache at its default (10 MiB),
 * topology.optimization=all (the source topics are the tables' changelogs).
 *
 * With foreign_key=PATH the two tables are joined on a field of the left value instead
 * (KIP-213): KTable#join(other, foreignKeyExtractor, joiner) and #leftJoin, materialized
 * as "inner" and "left", the extractor reading the dotted PATH as kstate's
 * join.foreign_key does (foreignKey()).
 *
 *   GET /bench/join/{store}        every row of a store, "key\tvalue" per line
 *   GET /bench/key/{store}/{key}   one row's value, 404 when there is none
 *
 * Usage: Join key=value... with keys bootstrap, left, right, app_id, state_dir, port,
 * stream_threads (2), guarantee (exactly_once_v2 | at_least_once), cache_mb (64), record_cache_bytes
 * (statestore.cache.max.bytes; its default when not given), foreign_key.
 */
public final class Join {
  private static Set<String> stores = Set.of("inner", "left", "outer");
  private static KafkaStreams streams;

  /** kstate's joined value of a join view with the default names. */
  static String joined(String left, String right) {
    return "{\"left\":" + (left == null ? "null" : left) + ",\"right\":" + (right == null ? "null" : right) + "}";
  }

  /**
   * The right key a left value names at the dotted `path`, as kstate's join.foreign_key
   * reads it: a string is the key, a number its text; anything else (a value that is
   * not a JSON object, a missing member, null, a boolean, an object, an array) names
   * none, and the extractor returns null. Integers print alike here and in kstate; a
   * decimal such as 1e20 does not (Double.toString writes 1.0E20), so the bench's
   * foreign keys are strings and integers.
   */
  static String foreignKey(String value, String[] path) {
    Object v;
    try {
      v = Json.decodeValue(value);
    } catch (DecodeException e) {
      return null;
    }
    for (String member : path) {
      if (!(v instanceof JsonObject o)) return null;
      v = o.getValue(member);
    }
    if (v instanceof String s) return s;
    if (v instanceof Number) return v.toString();
    return null;
  }

  private static Materialized<String, String, KeyValueStore<Bytes, byte[]>> store(String name) {
    return Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as(name)
        .withKeySerde(Serdes.String())
        .withValueSerde(Serdes.String());
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> a = new HashMap<>();
    for (String s : argv) {
      int eq = s.indexOf('=');
      a.put(s.substring(0, eq), s.substring(eq + 1));
    }
    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, a.get("app_id"));
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
    p.put(StreamsConfig.STATE_DIR_CONFIG, a.get("state_dir"));
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(a.getOrDefault("stream_threads", "2")));
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, a.getOrDefault("guarantee", StreamsConfig.EXACTLY_ONCE_V2));
    p.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
    p.put(StreamsConfig.ROCKSDB_CONFIG_SETTER_CLASS_CONFIG, BoundedRocks.class);
    p.put("bench.cache.mb", a.getOrDefault("cache_mb", "64"));
    p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
    if (a.containsKey("record_cache_bytes"))
      p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, Long.parseLong(a.get("record_cache_bytes")));

    StreamsBuilder b = new StreamsBuilder();
    KTable<String, String> left = b.table(a.get("left"), Consumed.with(Serdes.String(), Serdes.String()));
    KTable<String, String> right = b.table(a.get("right"), Consumed.with(Serdes.String(), Serdes.String()));
    if (a.containsKey("foreign_key")) {
      String[] path = a.get("foreign_key").split("\\.");
      Function<String, String> fk = v -> foreignKey(v, path);
      stores = Set.of("inner", "left");
      left.join(right, fk, Join::joined, store("inner"));
      left.leftJoin(right, fk, Join::joined, store("left"));
    } else {
      left.join(right, Join::joined, store("inner"));
      left.leftJoin(right, Join::joined, store("left"));
      left.outerJoin(right, Join::joined, store("outer"));
    }
    streams = new KafkaStreams(b.build(p), p);
    streams.setUncaughtExceptionHandler(e -> {
      e.printStackTrace();
      return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
    });

    HttpServer http = HttpServer.create(new InetSocketAddress("127.0.0.1", Integer.parseInt(a.get("port"))), 64);
    http.createContext("/", Join::handle);
    CountDownLatch done = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      http.stop(0);
      streams.close(Duration.ofSeconds(60));
      done.countDown();
    }));
    streams.start();
    http.start();
    done.await();
  }

  private static ReadOnlyKeyValueStore<String, String> store(String name, HttpExchange ex) throws IOException {
    if (!stores.contains(name)) {
      send(ex, 404, "no store " + name + "\n");
      return null;
    }
    return streams.store(StoreQueryParameters.fromNameAndType(name, QueryableStoreTypes.<String, String>keyValueStore()));
  }

  private static void handle(HttpExchange ex) throws IOException {
    String path = ex.getRequestURI().getRawPath();
    try {
      if (path.startsWith("/bench/join/")) {
        ReadOnlyKeyValueStore<String, String> s = store(path.substring("/bench/join/".length()), ex);
        if (s == null) return;
        // Streamed (chunked): the full-size stores hold hundreds of MiB of rows.
        ex.sendResponseHeaders(200, 0);
        try (KeyValueIterator<String, String> it = s.all();
             java.io.Writer w = new java.io.BufferedWriter(
                 new java.io.OutputStreamWriter(ex.getResponseBody(), StandardCharsets.UTF_8), 1 << 16)) {
          while (it.hasNext()) {
            KeyValue<String, String> kv = it.next();
            w.write(kv.key);
            w.write('\t');
            w.write(kv.value);
            w.write('\n');
          }
        }
      } else if (path.startsWith("/bench/key/")) {
        String[] parts = path.substring("/bench/key/".length()).split("/", 2);
        ReadOnlyKeyValueStore<String, String> s = store(parts[0], ex);
        if (s == null) return;
        String v = parts.length < 2 ? null : s.get(URLDecoder.decode(parts[1], StandardCharsets.UTF_8));
        send(ex, v == null ? 404 : 200, v == null ? "not found\n" : v);
      } else {
        send(ex, 404, "no route\n");
      }
    } catch (RuntimeException e) {
      send(ex, 503, String.valueOf(e) + "\n");
    }
  }

  private static void send(HttpExchange ex, int status, String body) throws IOException {
    byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
    ex.sendResponseHeaders(status, bytes.length);
    try (OutputStream os = ex.getResponseBody()) {
      os.write(bytes);
    }
  }
}
