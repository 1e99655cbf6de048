// Produces records with arbitrary bytes through the real Java client (default
// partitioner: murmur2 of the key bytes), one per input line, and reports where each
// landed. Used by tests that need binary keys or a record's offset.
//
// Input lines:  <key hex or ->\t<value hex or ->[\t<timestamp ms>]   ("-" is null;
//               without a timestamp the producer's clock sets it)
// Output lines: <partition>:<offset>, in input order, once the record is acknowledged.
// Records are sent without waiting while more input is ready, so bulk input is fast and
// a single line written interactively is answered as soon as it is acknowledged.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.HexFormat;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class BytesProducer {
  public static void main(String[] args) throws Exception {
    if (args.length != 2) {
      System.err.println("usage: BytesProducer BOOTSTRAP TOPIC");
      System.exit(2);
    }
    Properties p = new Properties();
    p.put("bootstrap.servers", args[0]);
    p.put("acks", "all");
    p.put("linger.ms", "0");
    HexFormat hex = HexFormat.of();
    try (KafkaProducer<byte[], byte[]> producer =
             new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
         BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
      ArrayDeque<Future<RecordMetadata>> pending = new ArrayDeque<>();
      String line;
      while ((line = in.readLine()) != null) {
        if (!line.isEmpty()) {
          String[] f = line.split("\t", -1);
          byte[] key = f[0].equals("-") ? null : hex.parseHex(f[0]);
          byte[] value = f.length < 2 || f[1].equals("-") ? null : hex.parseHex(f[1]);
          Long timestamp = f.length < 3 ? null : Long.valueOf(f[2]);
          pending.add(producer.send(new ProducerRecord<>(args[1], null, timestamp, key, value)));
        }
        if (!in.ready() || pending.size() >= 10000) report(pending);
      }
      report(pending);
    }
  }

  private static void report(ArrayDeque<Future<RecordMetadata>> pending) throws Exception {
    while (!pending.isEmpty()) {
      RecordMetadata md = pending.poll().get();
      System.out.println(md.partition() + ":" + md.offset());
    }
    System.out.flush();
  }
}
