/*
 * Runs Kafka's own message generator over clients/src/main/resources/common/message, as Kafka's
 * build does, to produce the org.apache.kafka.common.message classes that the record classes
 * use (control records, for one). Kafka's command-line entry point needs argparse4j, which is not
 * on these machines, so this calls the generator's public entry point directly.
 *
 * Usage: java GenerateMessages INPUT_DIR OUTPUT_DIR
 */
import java.util.Collections;
import java.util.List;

public final class GenerateMessages {
    public static void main(String[] args) throws Exception {
        org.apache.kafka.message.MessageGenerator.processDirectories(
            "org.apache.kafka.common.message", args[1], args[0],
            List.of("ApiMessageTypeGenerator"), Collections.singletonList("MessageDataGenerator"));
    }
}
