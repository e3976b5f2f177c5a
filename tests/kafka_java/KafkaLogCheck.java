/*
 * Reads a Kafka log dir with Apache Kafka's own classes and prints what they saw, one JSON object
 * per line, for tests/compat/test_kafka_java.py to compare with what was written.
 *
 * Everything that interprets bytes here is Kafka's: FileRecords and its batches (CRC checks,
 * decompression through Kafka's codec wrappers, legacy wrapper offsets, control records),
 * OffsetIndex and TimeIndex (opened read-only), and the checkpoint file classes a broker uses at
 * start-up. This file only walks them and reports; it never writes to the log dir.
 *
 * Usage: java KafkaLogCheck LOGDIR [PARTITION_DIR_NAME ...]
 * With no partition names, every sub-directory that holds a .log file is checked.
 */
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.record.ControlRecordType;
import org.apache.kafka.common.record.EndTransactionMarker;
import org.apache.kafka.common.record.FileLogInputStream.FileChannelRecordBatch;
import org.apache.kafka.common.record.FileRecords;
import org.apache.kafka.common.record.RecordBatch;
import org.apache.kafka.storage.internals.checkpoint.LeaderEpochCheckpointFile;
import org.apache.kafka.storage.internals.checkpoint.OffsetCheckpointFile;
import org.apache.kafka.storage.internals.checkpoint.PartitionMetadataFile;
import org.apache.kafka.storage.internals.log.EpochEntry;
import org.apache.kafka.storage.internals.log.OffsetIndex;
import org.apache.kafka.storage.internals.log.OffsetPosition;
import org.apache.kafka.storage.internals.log.TimeIndex;
import org.apache.kafka.storage.internals.log.TimestampOffset;

import java.io.File;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

public final class KafkaLogCheck {
    private static final PrintStream OUT = new PrintStream(System.out, false, StandardCharsets.UTF_8);
    private static final String[] CHECKPOINTS = {
        "replication-offset-checkpoint", "recovery-point-offset-checkpoint", "log-start-offset-checkpoint"};

    /** One record as Kafka's reader returned it, kept for the index lookups. */
    private static final class Seen {
        final long offset;
        final long timestamp;
        final int batchPosition;

        Seen(long offset, long timestamp, int batchPosition) {
            this.offset = offset;
            this.timestamp = timestamp;
            this.batchPosition = batchPosition;
        }
    }

    /** One batch as Kafka's reader returned it (a legacy wrapper counts as one). */
    private static final class Shallow {
        final int position;
        final long baseOffset;
        final long lastOffset;
        final long maxTimestamp;

        Shallow(FileChannelRecordBatch b) {
            this.position = b.position();
            this.baseOffset = b.baseOffset();
            this.lastOffset = b.lastOffset();
            this.maxTimestamp = b.maxTimestamp();
        }
    }

    public static void main(String[] args) throws Exception {
        File logDir = new File(args[0]);
        for (String name : CHECKPOINTS) {
            File f = new File(logDir, name);
            if (f.isFile()) checkpoint(f);
        }
        List<File> partitions = new ArrayList<>();
        if (args.length > 1) {
            for (String name : Arrays.copyOfRange(args, 1, args.length)) partitions.add(new File(logDir, name));
        } else {
            File[] subs = logDir.listFiles(File::isDirectory);
            Arrays.sort(subs);
            for (File d : subs) {
                String[] logs = d.list((x, n) -> n.endsWith(".log"));
                if (logs != null && logs.length > 0) partitions.add(d);
            }
        }
        for (File d : partitions) partition(d);
        OUT.flush();
    }

    private static void checkpoint(File f) {
        try {
            Map<TopicPartition, Long> read = new OffsetCheckpointFile(f, null).read();
            StringBuilder sb = new StringBuilder("{\"kind\":\"checkpoint\",\"file\":").append(q(f.getName()))
                .append(",\"entries\":[");
            boolean first = true;
            for (Map.Entry<String, Long> e : sortable(read).entrySet()) {
                if (!first) sb.append(',');
                first = false;
                sb.append('[').append(q(e.getKey())).append(',').append(e.getValue()).append(']');
            }
            OUT.println(sb.append("]}"));
        } catch (Exception e) {
            error(f.getName(), null, -1, e);
        }
    }

    private static Map<String, Long> sortable(Map<TopicPartition, Long> m) {
        Map<String, Long> out = new TreeMap<>();
        m.forEach((tp, v) -> out.put(tp.topic() + "-" + tp.partition(), v));
        return out;
    }

    private static void partition(File dir) {
        String name = dir.getName();
        File epochs = new File(dir, "leader-epoch-checkpoint");
        if (epochs.isFile()) {
            try {
                StringBuilder sb = new StringBuilder("{\"kind\":\"leader-epochs\",\"partition\":").append(q(name))
                    .append(",\"entries\":[");
                boolean first = true;
                for (EpochEntry e : new LeaderEpochCheckpointFile(epochs, null).read()) {
                    if (!first) sb.append(',');
                    first = false;
                    sb.append('[').append(e.epoch).append(',').append(e.startOffset).append(']');
                }
                OUT.println(sb.append("]}"));
            } catch (Exception e) {
                error("leader-epoch-checkpoint", name, -1, e);
            }
        }
        File meta = new File(dir, "partition.metadata");
        if (meta.isFile()) {
            try {
                OUT.println("{\"kind\":\"partition-metadata\",\"partition\":" + q(name) + ",\"topicId\":"
                    + q(new PartitionMetadataFile(meta, null).read().topicId().toString()) + "}");
            } catch (Exception e) {
                error("partition.metadata", name, -1, e);
            }
        }
        String[] logs = dir.list((x, n) -> n.endsWith(".log"));
        Arrays.sort(logs);
        for (String log : logs) segment(dir, log);
    }

    private static void segment(File dir, String logName) {
        String stem = logName.substring(0, logName.length() - 4);
        long baseOffset = Long.parseLong(stem);
        String part = dir.getName();
        List<Seen> seen = new ArrayList<>();
        List<Shallow> batches = new ArrayList<>();
        int position = -1;
        try (FileRecords log = FileRecords.open(new File(dir, logName), false)) {
            long readBytes = 0;
            for (FileChannelRecordBatch batch : log.batches()) {
                position = batch.position();
                batch.ensureValid();
                batches.add(new Shallow(batch));
                readBytes += batch.sizeInBytes();
                OUT.println(batchJson(part, logName, batch, seen));
            }
            position = -1;
            List<String> problems = new ArrayList<>();
            // Kafka's reader stops quietly before bytes that are not a whole batch
            if (readBytes != log.sizeInBytes())
                problems.add((log.sizeInBytes() - readBytes) + " bytes at the end are not a whole batch");
            StringBuilder sb = new StringBuilder("{\"kind\":\"segment\",\"partition\":").append(q(part))
                .append(",\"segment\":").append(q(stem))
                .append(",\"sizeInBytes\":").append(log.sizeInBytes())
                .append(",\"batches\":").append(batches.size());
            indexes(sb, dir, stem, baseOffset, log, seen, batches, problems);
            sb.append(",\"problems\":[");
            for (int i = 0; i < Math.min(problems.size(), 20); i++)
                sb.append(i > 0 ? "," : "").append(q(problems.get(i)));
            OUT.println(sb.append("],\"problemCount\":").append(problems.size()).append('}'));
        } catch (Exception e) {
            error(logName, part, position, e);
        }
    }

    private static String batchJson(String part, String logName, FileChannelRecordBatch batch, List<Seen> seen) {
        StringBuilder sb = new StringBuilder("{\"kind\":\"batch\",\"partition\":").append(q(part))
            .append(",\"segment\":").append(q(logName))
            .append(",\"position\":").append(batch.position())
            .append(",\"sizeInBytes\":").append(batch.sizeInBytes())
            .append(",\"magic\":").append(batch.magic())
            .append(",\"baseOffset\":").append(batch.baseOffset())
            .append(",\"lastOffset\":").append(batch.lastOffset())
            .append(",\"compression\":").append(q(batch.compressionType().name))
            .append(",\"timestampType\":").append(q(batch.timestampType().name))
            .append(",\"maxTimestamp\":").append(batch.maxTimestamp())
            .append(",\"partitionLeaderEpoch\":").append(batch.partitionLeaderEpoch())
            .append(",\"producerId\":").append(batch.producerId())
            .append(",\"producerEpoch\":").append(batch.producerEpoch())
            .append(",\"baseSequence\":").append(batch.baseSequence())
            .append(",\"transactional\":").append(batch.isTransactional())
            .append(",\"control\":").append(batch.isControlBatch())
            .append(",\"records\":[");
        boolean first = true;
        // Iterating a batch is Kafka's decompression and, for legacy batches, its wrapper logic
        for (org.apache.kafka.common.record.Record r : batch) {
            r.ensureValid();
            if (!first) sb.append(',');
            first = false;
            sb.append("{\"offset\":").append(r.offset())
                .append(",\"timestamp\":").append(r.timestamp())
                .append(",\"key\":").append(b64(r.hasKey() ? r.key() : null))
                .append(",\"value\":").append(b64(r.hasValue() ? r.value() : null))
                .append(",\"headers\":[");
            Header[] headers = r.headers();
            for (int i = 0; i < headers.length; i++) {
                if (i > 0) sb.append(',');
                byte[] v = headers[i].value();
                sb.append('[').append(q(headers[i].key())).append(',')
                    .append(v == null ? "null" : q(Base64.getEncoder().encodeToString(v))).append(']');
            }
            sb.append(']');
            if (batch.isControlBatch()) {
                ControlRecordType type = ControlRecordType.parse(r.key());
                sb.append(",\"controlType\":").append(q(type.name()));
                if (type == ControlRecordType.COMMIT || type == ControlRecordType.ABORT)
                    sb.append(",\"coordinatorEpoch\":").append(EndTransactionMarker.deserialize(r).coordinatorEpoch());
            }
            sb.append('}');
            seen.add(new Seen(r.offset(), r.timestamp(), batch.position()));
        }
        return sb.append("]}").toString();
    }

    /**
     * The lookups a broker makes: an offset through OffsetIndex then FileRecords (what
     * LogSegment.translateOffset does), and a timestamp through TimeIndex, OffsetIndex and
     * FileRecords (what LogSegment.findOffsetByTimestamp does). Each answer is compared with the
     * one a full scan gives.
     */
    private static void indexes(StringBuilder sb, File dir, String stem, long baseOffset, FileRecords log,
                                List<Seen> seen, List<Shallow> batches, List<String> problems) throws Exception {
        File indexFile = new File(dir, stem + ".index");
        File timeFile = new File(dir, stem + ".timeindex");
        if (!indexFile.isFile() || !timeFile.isFile()) {
            sb.append(",\"indexes\":false");
            return;
        }
        OffsetIndex oi = new OffsetIndex(indexFile, baseOffset, -1, false);
        TimeIndex ti = new TimeIndex(timeFile, baseOffset, -1, false);
        try {
            oi.sanityCheck();
        } catch (Exception e) {
            problems.add("offset index: " + e);
        }
        try {
            ti.sanityCheck();
        } catch (Exception e) {
            problems.add("time index: " + e);
        }
        // every offset index entry points at the start of a batch holding its offset
        for (int n = 0; n < oi.entries(); n++) {
            OffsetPosition e = oi.entry(n);
            Shallow at = null;
            for (Shallow b : batches) if (b.position == e.position) at = b;
            if (at == null) problems.add("offset index entry " + n + " position " + e.position + " is no batch start");
            else if (e.offset < at.baseOffset || e.offset > at.lastOffset)
                problems.add("offset index entry " + n + " offset " + e.offset + " is not in the batch at " + e.position);
            if (n > 0 && (e.offset <= oi.entry(n - 1).offset || e.position <= oi.entry(n - 1).position))
                problems.add("offset index entry " + n + " does not increase");
        }
        for (int n = 1; n < ti.entries(); n++) {
            TimestampOffset a = ti.entry(n - 1), b = ti.entry(n);
            if (b.timestamp <= a.timestamp || b.offset < a.offset)
                problems.add("time index entry " + n + " does not increase");
        }
        // every time index entry is (largest timestamp so far, last offset of the first batch that
        // reached it), as LogSegment keeps them, and the last one holds the segment's largest
        long runningMax = RecordBatch.NO_TIMESTAMP;
        Map<Long, Long> reachedAt = new TreeMap<>();
        for (Shallow b : batches) {
            if (b.maxTimestamp > runningMax) {
                runningMax = b.maxTimestamp;
                reachedAt.put(b.lastOffset, b.maxTimestamp);
            }
        }
        for (int n = 0; n < ti.entries(); n++) {
            TimestampOffset e = ti.entry(n);
            Long ts = reachedAt.get(e.offset);
            if (ts == null || ts != e.timestamp)
                problems.add("time index entry " + n + " (" + e.timestamp + ", " + e.offset + ") is not where the "
                    + "largest timestamp so far was reached");
        }
        if (runningMax != RecordBatch.NO_TIMESTAMP && (ti.entries() == 0 || ti.lastEntry().timestamp != runningMax))
            problems.add("the time index does not end with the segment's largest timestamp " + runningMax);
        int offsetLookups = 0, timeLookups = 0;
        for (Seen s : seen) {
            OffsetPosition mapping = oi.lookup(s.offset);
            FileRecords.LogOffsetPosition found = log.searchForOffsetWithSize(s.offset, mapping.position);
            offsetLookups++;
            if (found == null || found.position != s.batchPosition)
                problems.add("offset " + s.offset + " found at " + (found == null ? "nothing" : found.position)
                    + ", its batch is at " + s.batchPosition);
        }
        long minTs = Long.MAX_VALUE;
        for (Seen s : seen) if (s.timestamp >= 0) minTs = Math.min(minTs, s.timestamp);
        if (minTs != Long.MAX_VALUE) {
            List<Long> targets = new ArrayList<>();
            targets.add(minTs - 1);
            for (Seen s : seen) if (s.timestamp >= 0) { targets.add(s.timestamp); targets.add(s.timestamp + 1); }
            for (long t : targets) {
                long want = -1;
                for (Seen s : seen) if (s.timestamp >= t) { want = s.offset; break; }
                TimestampOffset to = ti.lookup(t);
                int pos = oi.lookup(Math.max(to.offset, baseOffset)).position;
                FileRecords.TimestampAndOffset got = log.searchForTimestamp(t, pos, baseOffset);
                long gotOffset = got == null ? -1 : got.offset;
                timeLookups++;
                if (gotOffset != want)
                    problems.add("timestamp " + t + " found offset " + gotOffset + ", a scan finds " + want);
            }
        }
        sb.append(",\"indexes\":true")
            .append(",\"offsetEntries\":").append(oi.entries())
            .append(",\"timeEntries\":").append(ti.entries())
            .append(",\"offsetLookups\":").append(offsetLookups)
            .append(",\"timeLookups\":").append(timeLookups);
        oi.close();
        ti.close();
    }

    private static void error(String file, String part, int position, Exception e) {
        OUT.println("{\"kind\":\"error\",\"partition\":" + (part == null ? "null" : q(part)) + ",\"file\":" + q(file)
            + ",\"position\":" + position + ",\"exception\":" + q(e.getClass().getSimpleName())
            + ",\"message\":" + q(String.valueOf(e.getMessage())) + "}");
    }

    private static String b64(ByteBuffer b) {
        if (b == null) return "null";
        byte[] a = new byte[b.remaining()];
        b.duplicate().get(a);
        return q(Base64.getEncoder().encodeToString(a));
    }

    private static String q(Object o) {
        String s = String.valueOf(o);
        StringBuilder sb = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') sb.append('\\').append(c);
            else if (c < 0x20) sb.append(String.format("\\u%04x", (int) c));
            else sb.append(c);
        }
        return sb.append('"').toString();
    }
}
