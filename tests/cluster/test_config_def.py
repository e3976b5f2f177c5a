"""``config_def``: the one parser of each kind of config value, and Kafka's ConfigDef rules."""
from __future__ import annotations

import logging

import pytest

from pyspark_kafkalog.config_def import (BOOLEAN, DOUBLE, INT, LIST, LONG, NO_DEFAULT, STRING,
                                         ConfigDef, at_least, between, one_of)
from pyspark_kafkalog.errors import InvalidConfigError


def table() -> ConfigDef:
    return (ConfigDef("test config")
            .define("a.bool", BOOLEAN, False, "a flag")
            .define("a.int", INT, 5, "an int", validator=at_least(1))
            .define("a.long", LONG, 2**63 - 1, "a long")
            .define("a.double", DOUBLE, 1.0, "a rate", validator=between(0.001, 1e9))
            .define("a.str", STRING, "delete", "a policy", validator=one_of("delete", "compact"))
            .define("a.list", LIST, [], "a list")
            .define("a.must", STRING, NO_DEFAULT, "required"))


@pytest.mark.parametrize("raw, value", [("true", True), (" FALSE ", False), ("True", True),
                                        (True, True)])
def test_booleans_are_true_or_false_in_any_case(raw, value):
    assert table().parse_value("a.bool", raw) is value


@pytest.mark.parametrize("raw", ["yes", "1", "", "on", 1])
def test_anything_else_is_not_a_boolean(raw):
    with pytest.raises(InvalidConfigError, match="a.bool"):
        table().parse_value("a.bool", raw)


@pytest.mark.parametrize("name, raw", [("a.int", "1_000"), ("a.int", "2147483648"),
                                       ("a.int", "0"), ("a.int", "1.5"),
                                       ("a.long", "9223372036854775808"), ("a.long", "0x10"),
                                       ("a.double", "1e-300"), ("a.double", "nan"),
                                       ("a.double", "inf"), ("a.double", "1_0"),
                                       ("a.str", "compact,delete")])
def test_numbers_parse_as_kafka_parses_them(name, raw):
    with pytest.raises(InvalidConfigError, match=name.replace(".", r"\.")):
        table().parse_value(name, raw)


def test_values_parse_to_their_types():
    got = table().parse({"a.int": " 7 ", "a.long": "-3", "a.double": "2.5e3",
                         "a.str": "COMPACT", "a.list": "x, y,z"})
    assert got == {"a.int": 7, "a.long": -3, "a.double": 2500.0, "a.str": "COMPACT",
                   "a.list": ["x", "y", "z"]}


def test_unknown_names_are_errors_warnings_or_skipped(caplog):
    with pytest.raises(InvalidConfigError, match="unknown test config 'a.typo'"):
        table().parse({"a.typo": "1"})
    with caplog.at_level(logging.WARNING):
        assert table().parse({"a.typo": "1"}, unknown="warn") == {}
    assert "a.typo" in caplog.text
    assert table().parse({"a.typo": "1"}, unknown="ignore") == {}


def test_defaults_fill_in_and_a_required_key_must_be_given():
    with pytest.raises(InvalidConfigError, match="missing required test config 'a.must'"):
        table().parse({}, defaults=True)
    got = table().parse({"a.must": "x"}, defaults=True, by_attr=True)
    assert got["a_int"] == 5 and got["a_must"] == "x" and got["a_bool"] is False


def test_the_docs_table_has_a_row_per_key():
    md = table().markdown_table()
    assert md.count("\n") == 2 + 6
    assert "| `a.int` | int | `5` | [1,...] | an int |" in md
