#pragma once
// name_this_thread(): names the calling thread, as top -H, perf and gdb show it.
//
// Every long-lived kstate thread has a name starting with "ks-" (the kernel keeps 15
// bytes), so an operator can tell where the CPU goes: ks-ingest polls Kafka and builds
// batches, ks-writer writes them to RocksDB, ks-http serves requests, and so on
// (docs/operations.md lists them). librdkafka's threads are named "rdk:...", RocksDB's
// "rocksdb:...".

namespace kstate {

// Longer names are cut to 15 bytes. Never fails (a thread without a name still works).
void name_this_thread(const char* name) noexcept;

}  // namespace kstate
