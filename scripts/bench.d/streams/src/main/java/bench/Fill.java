package bench;

import java.io.BufferedWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.SplittableRandom;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * Data of scripts/bench, written with the Java producer (default partitioner: murmur2).
 *
 *   Fill fill bootstrap=B topic=T records=N keys=K partitions=P keyfile=F sample=S seed=X
 *     N records over K keys: keys 0..K-1 once each in order, then uniformly random keys,
 *     so the table ends with exactly K keys. Writes S lookup keys to F, one per line
 *     "key<TAB>partition<TAB>present": 95% present keys, 5% keys never written (404).
 *   Fill append bootstrap=B topic=T keys=K rate=R seconds=D seed=X
 *     updates of existing keys at R records/s for D seconds (lookups under ingest).
 *   Fill burst bootstrap=B topic=T keys=K records=N seed=X
 *     N updates of existing keys as fast as the producer goes (a backlog).
 *   Fill lines bootstrap=B topic=T keys=V records=N countfile=F seed=X
 *     N lines of text over a vocabulary of V words, for the word count (see lines()).
 *   Fill join bootstrap=B left=L right=R records=N keys=K partitions=P statefile=F seed=X
 *     two tables for the join views, N records on each side (see join()).
 *   Fill fkjoin bootstrap=B left=L right=R records=N keys=K partitions=P right_partitions=Q statefile=F seed=X
 *     orders naming customers by a field, for the foreign-key join views (see fkJoin()).
 *
 * Keys are 16 bytes ("k" + 15 digits); values are 100-byte JSON documents that are
 * already compact with sorted keys, i.e. what kstate prints back byte for byte.
 */
public final class Fill {
  static byte[] key(long id) {
    return String.format("k%015d", id).getBytes(StandardCharsets.US_ASCII);
  }

  static byte[] value(long id, long seq) {
    String tail = "\",\"k\":" + id + ",\"s\":" + seq + "}";
    int pad = 100 - "{\"a\":\"".length() - tail.length();
    StringBuilder b = new StringBuilder(100).append("{\"a\":\"");
    for (int i = 0; i < pad; i++) b.append((char) ('a' + (int) ((id + seq + i) % 26)));
    return b.append(tail).toString().getBytes(StandardCharsets.US_ASCII);
  }

  /**
   * Lines of text for the word count: 4 to 12 words each, drawn from a vocabulary of
   * `vocabulary` words with Zipf-like frequencies (rank i with probability ∝ 1/i), some
   * capitalized, separated by ASCII spaces and punctuation, so that kstate's word
   * splitter and Java's split("\\W+") agree on them. The expected count of every
   * (lower-cased) word goes to `countfile`, "word\tcount" per line; the last line is
   * "\ttotal" with the number of words.
   */
  static long lines(KafkaProducer<byte[], byte[]> prod, String topic, long records, int vocabulary, SplittableRandom rnd,
                    Path countfile, AtomicReference<Exception> failed) throws Exception {
    String[] words = new String[vocabulary];
    String letters = "etaoinshrdlucmfwypvbgkjqxz";
    for (int i = 0; i < vocabulary; i++) {
      // i + 26^2 in base 26: distinct words of three letters or more.
      StringBuilder w = new StringBuilder();
      for (int n = i + 676; n > 0; n /= letters.length()) w.append(letters.charAt(n % letters.length()));
      words[i] = w.toString();
    }
    double[] cdf = new double[vocabulary];
    double sum = 0;
    for (int i = 0; i < vocabulary; i++) cdf[i] = (sum += 1.0 / (i + 1));
    for (int i = 0; i < vocabulary; i++) cdf[i] /= sum;
    long[] counts = new long[vocabulary];
    long total = 0;
    String[] separators = {" ", " ", " ", ", ", ". ", " - ", "; ", " (", ") "};
    StringBuilder line = new StringBuilder(128);
    for (long seq = 0; seq < records; seq++) {
      line.setLength(0);
      int n = 4 + rnd.nextInt(9);
      for (int j = 0; j < n; j++) {
        int idx = java.util.Arrays.binarySearch(cdf, rnd.nextDouble());
        if (idx < 0) idx = -idx - 1;
        if (idx >= vocabulary) idx = vocabulary - 1;
        counts[idx]++;
        total++;
        if (j > 0) line.append(separators[rnd.nextInt(separators.length)]);
        String w = words[idx];
        if (rnd.nextInt(10) == 0) line.append(Character.toUpperCase(w.charAt(0))).append(w, 1, w.length());
        else line.append(w);
      }
      if (rnd.nextInt(4) == 0) line.append('.');
      prod.send(new ProducerRecord<>(topic, ("l" + seq).getBytes(StandardCharsets.US_ASCII),
          line.toString().getBytes(StandardCharsets.US_ASCII)), (md, e) -> {
        if (e != null) failed.compareAndSet(null, e);
      });
      if (failed.get() != null) throw failed.get();
    }
    prod.flush();
    try (BufferedWriter w = Files.newBufferedWriter(countfile)) {
      for (int i = 0; i < vocabulary; i++)
        if (counts[i] > 0) w.write(words[i] + "\t" + counts[i] + "\n");
      w.write("\ttotal\t" + total + "\n");
    }
    return records;
  }

  /** A random JSON document of one side: a few members of every JSON type, some nested. */
  static String joinValue(SplittableRandom rnd, char side, long id, long seq) {
    StringBuilder b = new StringBuilder(160).append("{\"side\":\"").append(side).append("\",\"id\":").append(id)
        .append(",\"seq\":").append(seq);
    if (rnd.nextInt(3) > 0) b.append(",\"amount\":").append(rnd.nextInt(1_000_000) / 100.0);
    if (rnd.nextBoolean()) {
      b.append(",\"name\":\"");
      String alphabet = "abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789";
      for (int i = rnd.nextInt(24); i > 0; i--) {
        int c = rnd.nextInt(alphabet.length() + 3);
        if (c < alphabet.length()) b.append(alphabet.charAt(c));
        else if (c == alphabet.length()) b.append("\\\"");  // an escaped quote
        else if (c == alphabet.length() + 1) b.append("\u00e9");  // é, escaped
        else b.append('\u00fc');  // ü, as UTF-8
      }
      b.append('"');
    }
    if (rnd.nextInt(4) == 0) b.append(",\"flag\":").append(rnd.nextInt(3) == 0 ? "null" : rnd.nextBoolean());
    if (rnd.nextInt(3) == 0) {
      b.append(",\"tags\":[");
      for (int i = rnd.nextInt(4); i > 0; i--) b.append(rnd.nextInt(1000)).append(i > 1 ? "," : "");
      b.append(']');
    }
    if (rnd.nextInt(4) == 0)
      b.append(",\"address\":{\"city\":\"c").append(rnd.nextInt(500)).append("\",\"geo\":{\"x\":")
          .append(rnd.nextInt(2001) - 1000).append(",\"y\":").append(rnd.nextLong()).append("}}");
    return b.append('}').toString();
  }

  /**
   * Two tables for the join views: `records` records on each side, interleaved, over ids
   * 0..keys-1. The left side draws its keys from the first three quarters of the ids,
   * the right side from the last three, so half of the keys can have both sides, a
   * quarter only a left one and a quarter only a right one. One record in eight is a
   * tombstone (also of keys that have no value yet). Then, in every partition of both
   * topics, one end marker whose key sorts after every data key: a system has applied a
   * partition of both inputs once its inner join holds that partition's marker.
   * `statefile` gets the latest value of each side per key, "key\tleft\tright" per line
   * (empty: no value), markers included; the markers' keys are printed in the result.
   */
  static long join(KafkaProducer<byte[], byte[]> prod, Map<String, String> a, SplittableRandom rnd,
                   AtomicReference<Exception> failed) throws Exception {
    String left = a.get("left"), right = a.get("right");
    long records = Long.parseLong(a.get("records"));
    long keys = Long.parseLong(a.get("keys"));
    int partitions = Integer.parseInt(a.get("partitions"));
    long span = keys * 3 / 4, rightFrom = keys - span;
    Map<String, String[]> state = new java.util.TreeMap<>();
    long sent = 0;
    for (long seq = 0; seq < records; seq++) {
      for (int side = 0; side < 2; side++) {
        long id = (side == 0 ? 0 : rightFrom) + rnd.nextLong(span);
        String k = String.format("k%09d", id);
        String v = rnd.nextInt(8) == 0 ? null : joinValue(rnd, side == 0 ? 'L' : 'R', id, seq);
        state.computeIfAbsent(k, x -> new String[2])[side] = v;
        prod.send(new ProducerRecord<>(side == 0 ? left : right, k.getBytes(StandardCharsets.UTF_8),
            v == null ? null : v.getBytes(StandardCharsets.UTF_8)), (md, e) -> {
          if (e != null) failed.compareAndSet(null, e);
        });
        sent++;
      }
      if (failed.get() != null) throw failed.get();
    }
    // One marker per partition, found by the producer's own partitioner (murmur2).
    String[] markers = new String[partitions];
    int found = 0;
    for (int n = 0; found < partitions; n++) {
      String k = "~end-" + n;
      int part = Utils.toPositive(Utils.murmur2(k.getBytes(StandardCharsets.UTF_8))) % partitions;
      if (markers[part] != null) continue;
      markers[part] = k;
      found++;
    }
    for (int part = 0; part < partitions; part++) {
      String k = markers[part];
      String[] sides = state.computeIfAbsent(k, x -> new String[2]);
      for (int side = 0; side < 2; side++) {
        sides[side] = "{\"end\":" + part + "}";
        prod.send(new ProducerRecord<>(side == 0 ? left : right, k.getBytes(StandardCharsets.UTF_8),
            sides[side].getBytes(StandardCharsets.UTF_8)), (md, e) -> {
          if (e != null) failed.compareAndSet(null, e);
        });
        sent++;
      }
    }
    prod.flush();
    try (BufferedWriter w = Files.newBufferedWriter(Path.of(a.get("statefile")), StandardCharsets.UTF_8)) {
      for (Map.Entry<String, String[]> e : state.entrySet()) {
        String[] v = e.getValue();
        w.write(e.getKey() + "\t" + (v[0] == null ? "" : v[0]) + "\t" + (v[1] == null ? "" : v[1]) + "\n");
      }
    }
    return sent;
  }

  /** The first key "~end-<prefix><n>" that the producer's partitioner (murmur2) puts in `partition`. */
  static String markerKey(String prefix, int partition, int partitions, java.util.Set<String> taken) {
    for (int n = 0; ; n++) {
      String k = "~end-" + prefix + n;
      if (!taken.contains(k) && Utils.toPositive(Utils.murmur2(k.getBytes(StandardCharsets.UTF_8))) % partitions == partition) {
        taken.add(k);
        return k;
      }
    }
  }

  static void send(KafkaProducer<byte[], byte[]> prod, String topic, String key, String value,
                   AtomicReference<Exception> failed) {
    prod.send(new ProducerRecord<>(topic, key.getBytes(StandardCharsets.UTF_8),
        value == null ? null : value.getBytes(StandardCharsets.UTF_8)), (md, e) -> {
      if (e != null) failed.compareAndSet(null, e);
    });
  }

  /**
   * Two tables for the foreign-key join views: orders (`left`, P partitions) whose
   * member "customer":{"id": ...} names a customer (`right`, Q partitions), `records`
   * records on each side, interleaved. Orders use `keys` ids ("o" + 9 digits), customers
   * keys/4 ids j: odd ones keyed "c<j>" and named by that string, even ones keyed "<j>"
   * and named by the number j (an integer, whose JSON text is the key). The first eighth
   * of the customer ids is named but never written. An order update keeps its customer
   * half of the time, else names a random one; one in eight is a tombstone; one in twelve
   * names no customer: the member missing, "customer" not an object, or "id" null, a
   * boolean, an object or an array. One customer record in eight is a tombstone.
   * Last, one end marker per customer partition q, and per pair (p, q) an order marker in
   * partition p naming q's marker: once every pair's row holds its customer, each order
   * partition's records and each customer partition's records, and the answers between
   * them, have been applied (both systems keep each partition-to-partition path in order).
   * `statefile` gets each table's last values, "O|C\tkey\tvalue" per line, markers included.
   */
  static long fkJoin(KafkaProducer<byte[], byte[]> prod, Map<String, String> a, SplittableRandom rnd,
                     AtomicReference<Exception> failed) throws Exception {
    String left = a.get("left"), right = a.get("right");
    long records = Long.parseLong(a.get("records"));
    long keys = Long.parseLong(a.get("keys"));
    int partitions = Integer.parseInt(a.get("partitions"));
    int rightPartitions = Integer.parseInt(a.get("right_partitions"));
    long customers = Math.max(8, keys / 4), unwritten = customers / 8;
    Map<String, String> orders = new java.util.TreeMap<>(), custs = new java.util.TreeMap<>();
    Map<Long, Long> named = new HashMap<>();  // order id -> the customer id it names now
    String[] noCustomer = {"", ",\"customer\":\"c1\"", ",\"customer\":{\"id\":null}", ",\"customer\":{\"id\":true}",
        ",\"customer\":{\"id\":{\"id\":\"c1\"}}", ",\"customer\":{\"id\":[\"c1\"]}", ",\"customer\":{\"name\":\"x\"}"};
    long sent = 0;
    for (long seq = 0; seq < records; seq++) {
      long id = rnd.nextLong(keys);
      String k = String.format("o%09d", id), v;
      int roll = rnd.nextInt(24);
      if (roll < 3) {
        v = null;
        named.remove(id);
      } else {
        String member;
        if (roll < 5) {
          member = noCustomer[rnd.nextInt(noCustomer.length)];
          named.remove(id);
        } else {
          Long j = named.get(id);
          if (j == null || rnd.nextBoolean()) j = rnd.nextLong(customers);
          named.put(id, j);
          member = ",\"customer\":{\"id\":" + (j % 2 == 1 ? "\"c" + j + "\"" : String.valueOf(j)) + "}";
        }
        String body = joinValue(rnd, 'L', id, seq);
        v = body.substring(0, body.length() - 1) + member + "}";
      }
      if (v == null) orders.remove(k);
      else orders.put(k, v);
      send(prod, left, k, v, failed);
      long j = unwritten + rnd.nextLong(customers - unwritten);
      String ck = j % 2 == 1 ? "c" + j : String.valueOf(j);
      String cv = rnd.nextInt(8) == 0 ? null : joinValue(rnd, 'R', j, seq);
      if (cv == null) custs.remove(ck);
      else custs.put(ck, cv);
      send(prod, right, ck, cv, failed);
      sent += 2;
      if (failed.get() != null) throw failed.get();
    }
    java.util.Set<String> taken = new java.util.HashSet<>();
    String[] customerMarkers = new String[rightPartitions];
    for (int q = 0; q < rightPartitions; q++) {
      customerMarkers[q] = markerKey("c", q, rightPartitions, taken);
      custs.put(customerMarkers[q], "{\"end\":" + q + "}");
      send(prod, right, customerMarkers[q], custs.get(customerMarkers[q]), failed);
      sent++;
    }
    for (int p = 0; p < partitions; p++) {
      for (int q = 0; q < rightPartitions; q++) {
        String k = markerKey("o", p, partitions, taken);
        orders.put(k, "{\"end\":[" + p + "," + q + "],\"customer\":{\"id\":\"" + customerMarkers[q] + "\"}}");
        send(prod, left, k, orders.get(k), failed);
        sent++;
      }
    }
    prod.flush();
    try (BufferedWriter w = Files.newBufferedWriter(Path.of(a.get("statefile")), StandardCharsets.UTF_8)) {
      for (Map.Entry<String, String> e : orders.entrySet()) w.write("O\t" + e.getKey() + "\t" + e.getValue() + "\n");
      for (Map.Entry<String, String> e : custs.entrySet()) w.write("C\t" + e.getKey() + "\t" + e.getValue() + "\n");
    }
    return sent;
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> a = new HashMap<>();
    for (int i = 1; i < argv.length; i++) {
      int eq = argv[i].indexOf('=');
      a.put(argv[i].substring(0, eq), argv[i].substring(eq + 1));
    }
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
    p.put(ProducerConfig.ACKS_CONFIG, "1");
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
    p.put(ProducerConfig.LINGER_MS_CONFIG, "20");
    p.put(ProducerConfig.BATCH_SIZE_CONFIG, "262144");
    p.put(ProducerConfig.BUFFER_MEMORY_CONFIG, String.valueOf(128L << 20));
    p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    String topic = a.get("topic");
    long keys = Long.parseLong(a.getOrDefault("keys", "0"));
    SplittableRandom rnd = new SplittableRandom(Long.parseLong(a.getOrDefault("seed", "1")));
    AtomicReference<Exception> failed = new AtomicReference<>();
    long t0 = System.nanoTime();
    long sent = 0;
    try (KafkaProducer<byte[], byte[]> prod = new KafkaProducer<>(p)) {
      if (argv[0].equals("fill")) {
        long records = Long.parseLong(a.get("records"));
        for (long seq = 0; seq < records; seq++) {
          long id = seq < keys ? seq : rnd.nextLong(keys);
          prod.send(new ProducerRecord<>(topic, key(id), value(id, seq)), (md, e) -> {
            if (e != null) failed.compareAndSet(null, e);
          });
          if (failed.get() != null) throw failed.get();
        }
        sent = records;
        prod.flush();
        int partitions = Integer.parseInt(a.get("partitions"));
        int sample = Integer.parseInt(a.get("sample"));
        try (BufferedWriter w = Files.newBufferedWriter(Path.of(a.get("keyfile")))) {
          for (int i = 0; i < sample; i++) {
            boolean present = rnd.nextInt(100) < 95;
            long id = present ? rnd.nextLong(keys) : keys + rnd.nextLong(keys);
            byte[] k = key(id);
            int part = Utils.toPositive(Utils.murmur2(k)) % partitions;
            w.write(new String(k, StandardCharsets.US_ASCII) + "\t" + part + "\t" + (present ? 1 : 0) + "\n");
          }
        }
      } else if (argv[0].equals("append")) {
        double rate = Double.parseDouble(a.get("rate"));
        double seconds = Double.parseDouble(a.get("seconds"));
        long seq0 = Long.parseLong(a.getOrDefault("seq0", "100000000"));
        long end = t0 + (long) (seconds * 1e9);
        while (true) {
          long now = System.nanoTime();
          if (now >= end) break;
          long due = (long) ((now - t0) / 1e9 * rate);
          for (; sent < due; sent++) {
            long id = rnd.nextLong(keys);
            prod.send(new ProducerRecord<>(topic, key(id), value(id, seq0 + sent)), (md, e) -> {
              if (e != null) failed.compareAndSet(null, e);
            });
          }
          if (failed.get() != null) throw failed.get();
          Thread.sleep(1);
        }
        prod.flush();
      } else if (argv[0].equals("burst")) {
        // A backlog of updates of existing keys, as fast as the producer goes.
        long records = Long.parseLong(a.get("records"));
        long seq0 = Long.parseLong(a.getOrDefault("seq0", "200000000"));
        for (; sent < records; sent++) {
          long id = rnd.nextLong(keys);
          prod.send(new ProducerRecord<>(topic, key(id), value(id, seq0 + sent)), (md, e) -> {
            if (e != null) failed.compareAndSet(null, e);
          });
          if (failed.get() != null) throw failed.get();
        }
        prod.flush();
      } else if (argv[0].equals("lines")) {
        sent = lines(prod, topic, Long.parseLong(a.get("records")), (int) keys, rnd, Path.of(a.get("countfile")), failed);
      } else if (argv[0].equals("join")) {
        sent = join(prod, a, rnd, failed);
      } else if (argv[0].equals("fkjoin")) {
        sent = fkJoin(prod, a, rnd, failed);
      } else {
        throw new IllegalArgumentException("fill | append | burst | lines | join | fkjoin");
      }
    }
    if (failed.get() != null) throw failed.get();
    double s = (System.nanoTime() - t0) / 1e9;
    System.out.printf("{\"records\":%d,\"seconds\":%.3f,\"rps\":%.0f}%n", sent, s, sent / s);
  }
}
