/*
 * Kafka's Java producer's choice of partition for a keyed record, for tests/compat/test_kafka_java.py:
 * BuiltInPartitioner.partitionForKey, which is toPositive(Utils.murmur2(key)) % numPartitions.
 *
 * Usage: java KafkaPartitioner NUM_PARTITIONS < keys (one base64 key per line) > partitions
 */
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;

public final class KafkaPartitioner {
    public static void main(String[] args) throws Exception {
        int numPartitions = Integer.parseInt(args[0]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.US_ASCII);
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            byte[] key = Base64.getDecoder().decode(line.trim());
            out.println(BuiltInPartitioner.partitionForKey(key, numPartitions));
        }
        out.flush();
    }
}
