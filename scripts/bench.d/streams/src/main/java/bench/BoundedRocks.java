package bench;

import java.util.Map;

import org.apache.kafka.streams.state.RocksDBConfigSetter;
import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.BloomFilter;
import org.rocksdb.Cache;
import org.rocksdb.CompressionType;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;
import org.rocksdb.WriteBufferManager;

/**
 * RocksDB settings of the baseline, matched to kstate's defaults (docs/configuration.md,
 * rocksdb.*): one LRU block cache shared by every store of the process, bloom filters
 * of 10 bits per key, index and filter blocks in the cache, lz4, 16 MiB memtables, at
 * most 2 per store, 2 background jobs.
 *
 * kstate keeps all partitions in one RocksDB (one column family) with a 64 MiB block
 * cache and at most 2 × 16 MiB memtables. Kafka Streams opens one RocksDB per partition
 * (6 here), so without a bound its memtables alone could take 6 × 32 MiB. This follows
 * Kafka Streams' documented bounded-memory recipe instead: a WriteBufferManager of
 * bench.memtable.mb (32) charged to a cache of bench.cache.mb + bench.memtable.mb
 * (64 + 32), i.e. the same total of block cache plus memtables as kstate.
 */
public final class BoundedRocks implements RocksDBConfigSetter {
  private static Cache cache;
  private static WriteBufferManager wbm;

  private static synchronized void init(long cacheMb, long memtableMb) {
    if (cache != null) return;
    cache = new LRUCache((cacheMb + memtableMb) << 20);
    wbm = new WriteBufferManager(memtableMb << 20, cache);
  }

  @Override
  public void setConfig(String storeName, Options options, Map<String, Object> configs) {
    long cacheMb = Long.parseLong(String.valueOf(configs.getOrDefault("bench.cache.mb", "64")));
    long memtableMb = Long.parseLong(String.valueOf(configs.getOrDefault("bench.memtable.mb", "32")));
    init(cacheMb, memtableMb);
    BlockBasedTableConfig t = (BlockBasedTableConfig) options.tableFormatConfig();
    t.setBlockCache(cache);
    t.setCacheIndexAndFilterBlocks(true);
    t.setPinL0FilterAndIndexBlocksInCache(true);
    t.setFilterPolicy(new BloomFilter(10, false));
    t.setFormatVersion(5);
    options.setTableFormatConfig(t);
    options.setWriteBufferManager(wbm);
    options.setWriteBufferSize(16L << 20);
    options.setMaxWriteBufferNumber(2);
    options.setCompressionType(CompressionType.LZ4_COMPRESSION);
    options.setMaxBackgroundJobs(2);
    options.setLevelCompactionDynamicLevelBytes(true);
  }

  @Override
  public void close(String storeName, Options options) {
    // The cache and the write buffer manager are shared by every store: kept open.
  }
}
