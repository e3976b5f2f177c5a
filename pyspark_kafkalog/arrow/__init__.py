"""Kafka batches to and from Arrow's memory layout: the sink's encoder and accumulator, the
reader's route into Spark's layout, and the buffer pool they allocate from. Apart from
``format/`` (the wire codecs, which need no Arrow) so that storage and the log can load without
pyarrow's Arrow-side code."""
