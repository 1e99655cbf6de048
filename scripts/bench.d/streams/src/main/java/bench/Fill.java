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
    long keys = Long.parseLong(a.get("keys"));
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
      } else {
        throw new IllegalArgumentException("fill | append | burst | lines");
      }
    }
    if (failed.get() != null) throw failed.get();
    double s = (System.nanoTime() - t0) / 1e9;
    System.out.printf("{\"records\":%d,\"seconds\":%.3f,\"rps\":%.0f}%n", sent, s, sent / s);
  }
}
