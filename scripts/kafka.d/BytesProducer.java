// Produces records with arbitrary bytes through the real Java client (default
// partitioner: murmur2 of the key bytes), one per input line, and reports where each
// landed. Used by tests that need binary keys or a record's offset.
//
// Input lines:  <key hex or ->\t<value hex or ->      ("-" is null)
// Output lines: <partition>:<offset>                  (after each record is acknowledged)
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Properties;
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
      String line;
      while ((line = in.readLine()) != null) {
        if (line.isEmpty()) continue;
        String[] f = line.split("\t", -1);
        byte[] key = f[0].equals("-") ? null : hex.parseHex(f[0]);
        byte[] value = f.length < 2 || f[1].equals("-") ? null : hex.parseHex(f[1]);
        RecordMetadata md = producer.send(new ProducerRecord<>(args[1], key, value)).get();
        System.out.println(md.partition() + ":" + md.offset());
        System.out.flush();
      }
    }
  }
}
