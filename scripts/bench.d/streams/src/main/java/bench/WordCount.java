package bench;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

/**
 * The word count of scripts/bench, as the Kafka Streams documentation writes it
 * (WordCountDemo): lines → lower case → split("\\W+") → group by word → count, with
 * exactly_once_v2, through a repartition topic and a changelogged count store. The
 * record cache keeps its default (10 MiB), as a user of the demo would.
 *
 *   GET /bench/counts   every word and its count, "word\tcount" per line
 *
 * Usage: WordCount key=value... with keys bootstrap, topic, app_id, state_dir, port,
 * stream_threads (2), guarantee (exactly_once_v2 | at_least_once), cache_mb (64).
 */
public final class WordCount {
  private static final String STORE = "counts";
  private static KafkaStreams streams;

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
    p.put(StreamsConfig.ROCKSDB_CONFIG_SETTER_CLASS_CONFIG, BoundedRocks.class);
    p.put("bench.cache.mb", a.getOrDefault("cache_mb", "64"));
    p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

    StreamsBuilder b = new StreamsBuilder();
    b.stream(a.get("topic"), Consumed.with(Serdes.String(), Serdes.String()))
        .flatMapValues(line -> {
          List<String> words = new ArrayList<>();
          for (String w : line.toLowerCase(java.util.Locale.ROOT).split("\\W+"))
            if (!w.isEmpty()) words.add(w);
          return words;
        })
        .groupBy((k, word) -> word, Grouped.with(Serdes.String(), Serdes.String()))
        .count(Materialized.as(STORE));
    streams = new KafkaStreams(b.build(p), p);
    streams.setUncaughtExceptionHandler(e -> {
      e.printStackTrace();
      return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
    });

    HttpServer http = HttpServer.create(new InetSocketAddress("127.0.0.1", Integer.parseInt(a.get("port"))), 64);
    http.createContext("/", WordCount::handle);
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

  private static void handle(HttpExchange ex) throws IOException {
    String path = ex.getRequestURI().getRawPath();
    try {
      if (path.equals("/bench/counts")) {
        ReadOnlyKeyValueStore<String, Long> s =
            streams.store(StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.<String, Long>keyValueStore()));
        StringBuilder out = new StringBuilder(1 << 20);
        try (KeyValueIterator<String, Long> it = s.all()) {
          while (it.hasNext()) {
            KeyValue<String, Long> kv = it.next();
            out.append(kv.key).append('\t').append(kv.value).append('\n');
          }
        }
        send(ex, 200, out.toString());
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
