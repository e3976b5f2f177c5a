"""What Kafka's clients do, over the cluster protocol: the producer and its ``acks``, the
consumer, consumer groups and their committed offsets. Each is a library call the admin API,
the CLI, the jobs and the Spark source and sink share."""
