package bench;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.processor.CommitCallback;
import org.apache.kafka.streams.processor.StateRestoreCallback;
import org.apache.kafka.streams.processor.StateStore;
import org.apache.kafka.streams.processor.StateStoreContext;
import org.apache.kafka.streams.processor.TaskId;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.processor.internals.RecordBatchingStateRestoreCallback;
import org.apache.kafka.streams.query.Position;
import org.apache.kafka.streams.query.PositionBound;
import org.apache.kafka.streams.query.Query;
import org.apache.kafka.streams.query.QueryConfig;
import org.apache.kafka.streams.query.QueryResult;
import org.apache.kafka.streams.state.KeyValueBytesStoreSupplier;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.TimestampedBytesStore;
import org.apache.kafka.streams.StreamsMetrics;

/**
 * Kafka Streams' own persistent timestamped RocksDB store, with the offset of the record
 * that wrote each value kept next to it, and each partition's position (next offset
 * applied) tracked.
 *
 * Why: kstate's lookup answer carries "offset" (of the record that wrote the value) and
 * "position" (next offset the answer reflects). A plain KTable store has neither: IQv2
 * positions are not updated while restoring unless the internal consistency flag is on,
 * and record offsets are not stored at all. To answer with the same bytes the baseline
 * must keep them, which is what an application offering the same feature would write.
 *
 * Stored value: [timestamp 8][offset 8][value bytes], i.e. the inner store's
 * [timestamp][value] with the offset prepended to the value. A reader through the
 * timestamped layer with a byte-array value serde therefore sees [offset 8][value].
 * Both write paths are covered: put() during processing (offset from the record
 * metadata) and restoration from the source topic (offset from the ConsumerRecord).
 * Caching must be disabled for the store: the cache would hold values without offsets.
 *
 * Threads: one stream thread writes a given partition's store; HTTP threads read
 * POSITIONS concurrently (atomics).
 */
public final class OffsetStore implements KeyValueStore<Bytes, byte[]>, TimestampedBytesStore {

  /** store name → partition → next offset applied; read by the HTTP front. */
  public static final Map<String, Map<Integer, AtomicLong>> POSITIONS = new ConcurrentHashMap<>();

  public static long position(String store, int partition) {
    Map<Integer, AtomicLong> m = POSITIONS.get(store);
    if (m == null) return 0;
    AtomicLong a = m.get(partition);
    return a == null ? 0 : a.get();
  }

  public static KeyValueBytesStoreSupplier supplier(String name) {
    KeyValueBytesStoreSupplier inner = Stores.persistentTimestampedKeyValueStore(name);
    return new KeyValueBytesStoreSupplier() {
      @Override public String name() { return name; }
      @Override public KeyValueStore<Bytes, byte[]> get() { return new OffsetStore(inner.get()); }
      @Override public String metricsScope() { return inner.metricsScope(); }
    };
  }

  private final KeyValueStore<Bytes, byte[]> inner;
  private StateStoreContext context;
  private AtomicLong pos;
  private Path posFile;

  private OffsetStore(KeyValueStore<Bytes, byte[]> inner) { this.inner = inner; }

  private static byte[] withOffset(byte[] tsValue, long offset) {
    if (tsValue == null) return null;
    ByteBuffer b = ByteBuffer.allocate(tsValue.length + 8);
    b.put(tsValue, 0, 8).putLong(offset).put(tsValue, 8, tsValue.length - 8);
    return b.array();
  }

  private void advance(long nextOffset) {
    pos.accumulateAndGet(nextOffset, Math::max);
  }

  @Override
  public void init(StateStoreContext ctx, StateStore root) {
    this.context = ctx;
    TaskId task = ctx.taskId();
    pos = POSITIONS.computeIfAbsent(name(), n -> new ConcurrentHashMap<>())
                   .computeIfAbsent(task.partition(), p -> new AtomicLong());
    posFile = ctx.stateDir().toPath().resolve(name() + ".kstate-bench-position");
    long saved = 0;
    try {
      if (Files.exists(posFile)) saved = Long.parseLong(Files.readString(posFile).trim());
    } catch (IOException | NumberFormatException e) {
      saved = 0;
    }
    pos.set(saved);
    inner.init(new StateStoreContext() {
      @Override public String applicationId() { return ctx.applicationId(); }
      @Override public TaskId taskId() { return ctx.taskId(); }
      @Override public java.util.Optional<RecordMetadata> recordMetadata() { return ctx.recordMetadata(); }
      @Override public org.apache.kafka.common.serialization.Serde<?> keySerde() { return ctx.keySerde(); }
      @Override public org.apache.kafka.common.serialization.Serde<?> valueSerde() { return ctx.valueSerde(); }
      @Override public java.io.File stateDir() { return ctx.stateDir(); }
      @Override public StreamsMetrics metrics() { return ctx.metrics(); }
      @Override public Map<String, Object> appConfigs() { return ctx.appConfigs(); }
      @Override public Map<String, Object> appConfigsWithPrefix(String prefix) { return ctx.appConfigsWithPrefix(prefix); }
      @Override public void register(StateStore store, StateRestoreCallback cb) {
        ctx.register(store, wrap(cb));
      }
      @Override public void register(StateStore store, StateRestoreCallback cb, CommitCallback commit) {
        ctx.register(store, wrap(cb), commit);
      }
    }, root);
  }

  private StateRestoreCallback wrap(StateRestoreCallback cb) {
    if (!(cb instanceof RecordBatchingStateRestoreCallback)) {
      throw new IllegalStateException("unexpected restore callback " + cb.getClass());
    }
    RecordBatchingStateRestoreCallback target = (RecordBatchingStateRestoreCallback) cb;
    return (RecordBatchingStateRestoreCallback) records -> {
      List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>(records.size());
      long last = -1;
      for (ConsumerRecord<byte[], byte[]> r : records) {
        out.add(new ConsumerRecord<>(r.topic(), r.partition(), r.offset(), r.timestamp(), r.timestampType(),
            r.serializedKeySize(), r.serializedValueSize(), r.key(), withOffset(r.value(), r.offset()),
            r.headers(), r.leaderEpoch()));
        last = Math.max(last, r.offset());
      }
      target.restoreBatch(out);
      if (last >= 0) advance(last + 1);
    };
  }

  private long currentOffset() {
    return context.recordMetadata().map(RecordMetadata::offset)
        .orElseThrow(() -> new IllegalStateException("put without record metadata"));
  }

  @Override
  public void put(Bytes key, byte[] value) {
    long off = currentOffset();
    inner.put(key, withOffset(value, off));
    advance(off + 1);
  }

  @Override
  public byte[] putIfAbsent(Bytes key, byte[] value) {
    byte[] old = inner.get(key);
    if (old == null) put(key, value);
    return old;
  }

  @Override
  public void putAll(List<KeyValue<Bytes, byte[]>> entries) {
    for (KeyValue<Bytes, byte[]> e : entries) put(e.key, e.value);
  }

  @Override
  public byte[] delete(Bytes key) {
    byte[] old = inner.get(key);
    put(key, null);
    return old;
  }

  @Override public byte[] get(Bytes key) { return inner.get(key); }
  @Override public KeyValueIterator<Bytes, byte[]> range(Bytes from, Bytes to) { return inner.range(from, to); }
  @Override public KeyValueIterator<Bytes, byte[]> reverseRange(Bytes from, Bytes to) { return inner.reverseRange(from, to); }
  @Override public KeyValueIterator<Bytes, byte[]> all() { return inner.all(); }
  @Override public KeyValueIterator<Bytes, byte[]> reverseAll() { return inner.reverseAll(); }
  @Override
  public <PS extends Serializer<P>, P> KeyValueIterator<Bytes, byte[]> prefixScan(P prefix, PS ser) {
    return inner.prefixScan(prefix, ser);
  }
  @Override public long approximateNumEntries() { return inner.approximateNumEntries(); }
  @Override public String name() { return inner.name(); }

  @Deprecated
  @Override
  public void init(org.apache.kafka.streams.processor.ProcessorContext ctx, StateStore root) {
    init((StateStoreContext) ctx, root);
  }

  @Override
  public void flush() {
    inner.flush();
    // Written after the data is flushed, so a saved position never runs ahead of the
    // state on disk; a crash leaves an older one that restoration moves forward again.
    try {
      Path tmp = posFile.resolveSibling(posFile.getFileName() + ".tmp");
      Files.writeString(tmp, Long.toString(pos.get()), StandardCharsets.US_ASCII);
      Files.move(tmp, posFile, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    } catch (IOException e) {
      throw new org.apache.kafka.streams.errors.ProcessorStateException("cannot save position", e);
    }
  }

  @Override public void close() { inner.close(); }
  @Override public boolean persistent() { return true; }
  @Override public boolean isOpen() { return inner.isOpen(); }
  @Override
  public <R> QueryResult<R> query(Query<R> q, PositionBound b, QueryConfig c) { return inner.query(q, b, c); }
  @Override public Position getPosition() { return inner.getPosition(); }
}
