/* The ingest ceiling of scripts/bench: reads every partition of a topic from the start
 * with librdkafka and discards the records. Same client library and the same consumer
 * settings kstate forces (read_committed, partition EOF events), no group membership
 * (partitions are assigned directly), no processing.
 *
 *   rawconsume BOOTSTRAP TOPIC PARTITIONS EXPECTED_RECORDS
 *
 * Prints one JSON line: records, seconds (first record to last), rps, cpu_s (process
 * user+system CPU over the same span). */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static void set(rd_kafka_conf_t *c, const char *k, const char *v) {
  char err[512];
  if (rd_kafka_conf_set(c, k, v, err, sizeof err) != RD_KAFKA_CONF_OK) {
    fprintf(stderr, "rawconsume: %s: %s\n", k, err);
    exit(2);
  }
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: rawconsume BOOTSTRAP TOPIC PARTITIONS EXPECTED_RECORDS\n");
    return 2;
  }
  int partitions = atoi(argv[3]);
  long long expected = atoll(argv[4]);
  char err[512];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  set(conf, "bootstrap.servers", argv[1]);
  set(conf, "group.id", "kstate-bench-rawconsume");
  set(conf, "enable.auto.commit", "false");
  set(conf, "enable.auto.offset.store", "false");
  set(conf, "enable.partition.eof", "true");
  set(conf, "isolation.level", "read_committed");
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (!rk) {
    fprintf(stderr, "rawconsume: %s\n", err);
    return 1;
  }
  rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(partitions);
  for (int p = 0; p < partitions; p++)
    rd_kafka_topic_partition_list_add(parts, argv[2], p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_resp_err_t e = rd_kafka_assign(rk, parts);
  if (e) {
    fprintf(stderr, "rawconsume: assign: %s\n", rd_kafka_err2str(e));
    return 1;
  }
  rd_kafka_topic_partition_list_destroy(parts);

  long long n = 0, bytes = 0;
  double t0 = 0, c0 = 0, deadline = now_s() + 600;
  while (n < expected && now_s() < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (!m) continue;
    if (!m->err) {
      if (n == 0) {
        t0 = now_s();
        c0 = cpu_s();
      }
      n++;
      bytes += m->len + m->key_len;
    } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      fprintf(stderr, "rawconsume: %s\n", rd_kafka_message_errstr(m));
    }
    rd_kafka_message_destroy(m);
  }
  double secs = now_s() - t0, cpu = cpu_s() - c0;
  printf("{\"records\":%lld,\"bytes\":%lld,\"seconds\":%.3f,\"rps\":%.0f,\"cpu_s\":%.3f}\n", n, bytes, secs,
         n / (secs > 0 ? secs : 1), cpu);
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return n == expected ? 0 : 1;
}
