/*
 * Where the fields of a log entry's header are: the mirror, for C, of the layout constants of
 * pyspark_kafkalog/format/batch.py (their one home; tests/format/test_entry_scan.py checks that every
 * #define here has the same value there). Positions are from the start of an entry, except the
 * LEGACY_* ones, which are from the start of a magic 0/1 message (LOG_OVERHEAD bytes into its
 * entry), as in Kafka's LegacyRecord. Names are Kafka's (Records, DefaultRecordBatch).
 *
 * The rules of walking entries are batch.EntryScan / batch.scan_entries; C loops that inline the
 * walk say so where they do it.
 */
#ifndef KAFKALOG_BATCH_LAYOUT_H
#define KAFKALOG_BATCH_LAYOUT_H

#define BASE_OFFSET_OFFSET 0
#define LENGTH_OFFSET 8
#define LOG_OVERHEAD 12
#define PARTITION_LEADER_EPOCH_OFFSET 12
#define MAGIC_OFFSET 16
#define HEADER_SIZE_UP_TO_MAGIC 17
#define CRC_OFFSET 17
#define ATTRIBUTES_OFFSET 21
#define LAST_OFFSET_DELTA_OFFSET 23
#define BASE_TIMESTAMP_OFFSET 27
#define MAX_TIMESTAMP_OFFSET 35
#define PRODUCER_ID_OFFSET 43
#define PRODUCER_EPOCH_OFFSET 51
#define BASE_SEQUENCE_OFFSET 53
#define RECORDS_COUNT_OFFSET 57
#define RECORDS_OFFSET 61
#define RECORD_BATCH_OVERHEAD 61
#define V2_HEADER_SIZE 61
#define V2_CRC_START 21

#define LEGACY_CRC_OFFSET 0
#define LEGACY_MAGIC_OFFSET 4
#define LEGACY_ATTRIBUTES_OFFSET 5
#define LEGACY_TIMESTAMP_OFFSET 6
#define LEGACY_KEY_SIZE_OFFSET_V0 6
#define LEGACY_KEY_SIZE_OFFSET_V1 14
#define LEGACY_HEADER_SIZE_V0 6
#define LEGACY_HEADER_SIZE_V1 14
#define RECORD_OVERHEAD_V0 14
#define RECORD_OVERHEAD_V1 22

#endif
