"""The Spark source and sink without Spark: planning reads and streaming offsets, reading a
range into Arrow, encoding a task's Arrow batches and committing a job's writes. Kept apart from
``spark/`` so that each rule can be tested, and used by the jobs, without a SparkSession."""
