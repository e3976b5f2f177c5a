"""The config tables (``ConfigDef``s, issue #34) against what is written elsewhere: the tables in
docs/configuration.md name every key with its default and nothing else, every key in the
example files of conf/ (commented-out examples too) is known to its family's table and parses,
and defaults kept in code beside a table agree with it."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.cluster.config import CLUSTER_SETTINGS, STORAGE_PREFIX, cluster_options
from pyspark_kafkalog.config_def import ConfigDef
from pyspark_kafkalog.coordinator.config import COORDINATOR_SETTINGS, CoordinatorConfig
from pyspark_kafkalog.coordinator.scheduler import MAINTENANCE_SETTINGS, SchedulerConfig
from pyspark_kafkalog.format.checkpoint import parse_properties
from pyspark_kafkalog.log.config import TOPIC_CONFIGS, LogConfig

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"
CONF = REPO / "conf"
#: docs/configuration.md's tables, by the name in their marker
TABLES = {"topic": TOPIC_CONFIGS, "cluster": CLUSTER_SETTINGS,
          "coordinator": COORDINATOR_SETTINGS, "maintenance": MAINTENANCE_SETTINGS}
_TABLE = re.compile(r"<!-- config table: (\w+) [^\n]*-->\n((?:\|[^\n]*\n)+)<!-- /config table -->")
_ROW = re.compile(r"\| `([^`]+)` \| (\w+) \| `([^`]*)` \|")
#: ``#name=value``: an example left commented out in a conf file
_COMMENTED = re.compile(r"#([a-z][a-z0-9_.]*[a-z0-9_])=(.*)$")


def doc_tables() -> dict:
    found = {}
    for name, body in _TABLE.findall(DOC.read_text(encoding="utf-8")):
        rows = [line for line in body.splitlines()[2:]]
        found[name] = {}
        for line in rows:
            m = _ROW.match(line)
            assert m, f"docs/configuration.md, table {name}: a row that names no key: {line}"
            found[name][m.group(1)] = (m.group(2), m.group(3))
    return found


def test_the_docs_have_one_table_per_family():
    assert sorted(doc_tables()) == sorted(TABLES)


@pytest.mark.parametrize("family", sorted(TABLES))
def test_every_key_is_in_its_docs_table_with_its_default_and_nothing_else(family):
    table: ConfigDef = TABLES[family]
    rows = doc_tables()[family]
    unknown = sorted(set(rows) - set(table.names()))
    assert not unknown, f"docs/configuration.md ({family}) has rows of no {table.what}: {unknown}"
    missing = sorted(set(table.names()) - set(rows))
    assert not missing, f"docs/configuration.md ({family}) lacks {missing}"
    for name, (kind, default) in rows.items():
        key = table[name]
        assert (kind, default) == (key.type, key.default_text()), (
            f"docs/configuration.md: {name} is documented as {kind} {default!r}; the table says "
            f"{key.type} {key.default_text()!r} (markdown_table() makes the row)")


def conf_entries(path: Path) -> dict:
    """The file's properties, and the examples commented out in it (``#key=value``)."""
    text = path.read_text(encoding="latin-1")
    entries = dict(parse_properties(text))
    for line in text.splitlines():
        m = _COMMENTED.match(line.strip())
        if m:
            entries.setdefault(m.group(1), m.group(2).strip())
    return entries


def test_every_topic_config_in_conf_is_known_and_parses():
    entries = conf_entries(CONF / "topic.properties")
    assert entries
    for name, value in entries.items():
        assert name in TOPIC_CONFIGS, f"conf/topic.properties: unknown topic config {name}"
        LogConfig.from_properties({name: value})
    LogConfig.from_properties(parse_properties((CONF / "topic.properties").read_text()))


def test_every_cluster_setting_in_conf_is_known_and_parses():
    entries = conf_entries(CONF / "cluster.properties")
    assert entries
    for name, value in entries.items():
        assert name in CLUSTER_SETTINGS or name.startswith(STORAGE_PREFIX), (
            f"conf/cluster.properties: unknown cluster setting {name}")
        cluster_options({name: value})


def test_every_coordinator_setting_in_conf_is_known_parses_and_is_the_default():
    path = CONF / "coordinator.properties"
    for name, value in conf_entries(path).items():
        assert name in COORDINATOR_SETTINGS or name in MAINTENANCE_SETTINGS, (
            f"conf/coordinator.properties: unknown coordinator setting {name}")
        CoordinatorConfig.from_properties({name: value})
    # "Every value below is the default", says the file
    for name, value in parse_properties(path.read_text(encoding="latin-1")).items():
        key = (COORDINATOR_SETTINGS if name in COORDINATOR_SETTINGS else MAINTENANCE_SETTINGS)[name]
        assert value == key.default_text() or (value == "" and key.default in (None, "")), (
            f"conf/coordinator.properties: {name}={value}, its default is {key.default_text()}")
    assert CoordinatorConfig.from_properties(parse_properties(path.read_text())) == \
        CoordinatorConfig()


def test_defaults_kept_beside_a_table_agree_with_it():
    sig = inspect.signature(Cluster.__init__).parameters
    for key in CLUSTER_SETTINGS.keys.values():
        assert sig[key.attr].default == key.default, key.name
    from pyspark_kafkalog.coordinator.replicator import Replicator
    sig = inspect.signature(Replicator.__init__).parameters
    for name in ("replica.lag.time.max.ms", "broker.session.timeout.ms", "num.replica.fetchers",
                 "replica.verify.interval.ms"):
        key = COORDINATOR_SETTINGS[name]
        assert sig[key.attr].default == key.default, name
    assert LogConfig() == LogConfig.from_properties({})
    assert SchedulerConfig() == SchedulerConfig.from_properties({})


def test_coordinator_help_comes_from_the_table():
    import argparse

    from pyspark_kafkalog.cli import coordinator as cli
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(), [])
    sub = parser._subparsers._group_actions[0].choices["coordinator"]
    helps = {a.dest: a.help for a in sub._actions}
    for name in ("coordinator.bind", "coordinator.lease.ms", "coordinator.on.fenced",
                 "coordinator.metrics.port", "coordinator.token.file"):
        key = COORDINATOR_SETTINGS[name]
        assert helps[key.attr].startswith(COORDINATOR_SETTINGS.help_text(name)), name
