"""conf/ must stay true: every example file parses with the code that consumes it."""
from __future__ import annotations

from pathlib import Path

import pytest

from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.cluster.config import cluster_options, load_cluster_config
from pyspark_kafkalog.errors import InvalidConfigError
from pyspark_kafkalog.format.checkpoint import parse_properties
from pyspark_kafkalog.log.config import LogConfig

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_example_topic_config_is_valid_kafka_config():
    props = parse_properties((CONF / "topic.properties").read_text())
    cfg = LogConfig.from_properties(props)
    assert cfg.segment_bytes == 268435456 and cfg.compression_type == "zstd"


def test_example_cluster_config_opens_a_cluster(tmp_path):
    opts = load_cluster_config(str(CONF / "cluster.properties"))
    assert opts == {"transaction_timeout_ms": 60000, "snapshot_interval": 50,
                    "metadata_max_retention_ms": 3_600_000}
    c = Cluster(str(tmp_path / "c"), **opts)
    assert c.transaction_timeout_ms == 60000


def test_spark_defaults_snippet_is_key_value_lines():
    for line in (CONF / "spark-defaults.conf").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split(None, 1)
            assert key.startswith("spark.") and value.strip()


@pytest.mark.parametrize("props,needle", [({"transaction.timeout.ms": "soon"}, "integer"),
                                          ({"transaction.timeout.ms": "0"}, ">= 1"),
                                          ({"kafkalog.principle": "x"}, "kafkalog.principle")])
def test_bad_cluster_settings_are_named(props, needle):
    with pytest.raises(InvalidConfigError, match=needle):
        cluster_options(props)


def test_storage_options_pass_through():
    assert cluster_options({"storage.endpoint_url": "http://127.0.0.1:9"}) == {
        "endpoint_url": "http://127.0.0.1:9"}
