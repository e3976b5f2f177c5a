"""Configuration declared once per family, as Kafka's ``ConfigDef``: name, type, default,
bounds or validator, and a one-line doc.

Every family (topic configs, cluster client settings, coordinator settings, Spark options) is a
:class:`ConfigDef`; parsing, validation and its errors, ``--help`` text, the docs' tables and the
``conf/*.properties`` examples come from it, or are checked against it by a test. So a default
or a bound is written in one place, and two parsers of one kind of value cannot disagree (the
Spark write options once took ``yes`` for true where the read options refused it).

Types parse as Kafka's do: ``BOOLEAN`` is ``true``/``false`` in any case; ``INT`` and ``LONG``
are decimal integers in Java's ranges, without Python's ``1_000``; ``DOUBLE`` is a finite
decimal number; ``LIST`` is comma-separated; surrounding white space is ignored. A bad value is
an :class:`~pyspark_kafkalog.errors.InvalidConfigError` naming the config.
"""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .errors import InvalidConfigError

log = logging.getLogger(__name__)

BOOLEAN, INT, LONG, DOUBLE, STRING, LIST, PASSWORD = (
    "boolean", "int", "long", "double", "string", "list", "password")
INT_MAX, INT_MIN = 2**31 - 1, -2**31
LONG_MAX, LONG_MIN = 2**63 - 1, -2**63


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


#: a config that must be given (Kafka's ``NO_DEFAULT_VALUE``)
NO_DEFAULT = _NoDefault()

_INTEGER = re.compile(r"[+-]?[0-9]+\Z")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")


def invalid(name: str, raw: Any, rule: str) -> InvalidConfigError:
    """The one error shape for a bad value, naming the config, the rule it breaks and the value
    (Kafka's ``Invalid value X for configuration Y``): ``segment.bytes must be >= 14 (invalid
    value '1')``. ``rule`` completes "must be"."""
    return InvalidConfigError(f"{name} must be {rule} (invalid value {raw!r})")


def parse_bool(name: str, raw: Any) -> bool:
    """``true``/``false`` in any case (Kafka's BOOLEAN, and what Spark's options take)."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise invalid(name, raw, "true or false")


def parse_integer(name: str, raw: Any, low: int = LONG_MIN, high: int = LONG_MAX) -> int:
    if isinstance(raw, bool):
        raise invalid(name, raw, "an integer")
    if isinstance(raw, int):
        value = raw
    else:
        text = str(raw).strip()
        if not _INTEGER.match(text):
            raise invalid(name, raw, "an integer")
        value = int(text)
    if not low <= value <= high:
        raise invalid(name, raw, f"an integer in {low}..{high}")
    return value


def parse_double(name: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise invalid(name, raw, "a number")
    if isinstance(raw, (int, float)):
        value = float(raw)
    else:
        text = str(raw).strip()
        if not _DECIMAL.match(text):
            raise invalid(name, raw, "a number")
        value = float(text)
    if not math.isfinite(value):
        raise invalid(name, raw, "a finite number")
    return value


def parse_list(name: str, raw: Any) -> List[str]:
    if isinstance(raw, (list, tuple)):
        return [str(x).strip() for x in raw]
    text = str(raw).strip()
    return [part.strip() for part in text.split(",")] if text else []


_PARSERS: Dict[str, Callable[[str, Any], Any]] = {
    BOOLEAN: parse_bool,
    INT: lambda name, raw: parse_integer(name, raw, INT_MIN, INT_MAX),
    LONG: parse_integer,
    DOUBLE: parse_double,
    STRING: lambda name, raw: str(raw).strip(),
    PASSWORD: lambda name, raw: str(raw),
    LIST: parse_list,
}


# Validators: called with (name, parsed value, raw value); raise through ``invalid``.
Validator = Callable[[str, Any, Any], None]


@dataclass(frozen=True)
class Range:
    """``at_least``/``between`` of Kafka's ``ConfigDef.Range``."""
    low: Optional[float] = None
    high: Optional[float] = None

    def __call__(self, name: str, value: Any, raw: Any) -> None:
        if self.low is not None and value < self.low:
            raise invalid(name, raw, f">= {self.low}")
        if self.high is not None and value > self.high:
            raise invalid(name, raw, f"<= {self.high}")

    def __str__(self) -> str:
        if self.high is None:
            return f"[{self.low},...]"
        if self.low is None:
            return f"[...,{self.high}]"
        return f"[{self.low},...,{self.high}]"


def at_least(low: float) -> Range:
    return Range(low=low)


def between(low: float, high: float) -> Range:
    return Range(low=low, high=high)


@dataclass(frozen=True)
class OneOf:
    """Kafka's ``ValidString.in``, case-insensitive where Kafka's is (``CaseInsensitiveValidString``)."""
    choices: Tuple[str, ...]
    case_sensitive: bool = False

    def __call__(self, name: str, value: Any, raw: Any) -> None:
        values = value if isinstance(value, list) else [value]
        allowed = self.choices if self.case_sensitive else [c.lower() for c in self.choices]
        for v in values:
            if (v if self.case_sensitive else str(v).lower()) not in allowed:
                raise invalid(name, raw, f"one of {', '.join(self.choices)}")

    def __str__(self) -> str:
        return "[" + ", ".join(self.choices) + "]"


def one_of(*choices: str, case_sensitive: bool = False) -> OneOf:
    return OneOf(tuple(choices), case_sensitive)


@dataclass(frozen=True)
class Check:
    """A validator that is a function (raising :class:`InvalidConfigError`), with the text the
    docs' table shows for it (Kafka's ``Validator.toString``)."""
    fn: Validator
    text: str

    def __call__(self, name: str, value: Any, raw: Any) -> None:
        self.fn(name, value, raw)

    def __str__(self) -> str:
        return self.text


def check(text: str) -> Callable[[Validator], Check]:
    """``@check("[CreateTime, LogAppendTime]")`` over a validator function."""
    return lambda fn: Check(fn, text)


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: str
    default: Any
    doc: str
    validator: Optional[Validator] = None
    #: the Python name a parsed value goes by (a dataclass field or keyword argument)
    attr: Optional[str] = None
    #: the parsed, validated value -> the Python value (``CreateTime`` -> 0); it may refuse one
    #: with its own :class:`InvalidConfigError`. The default is given as a config value too.
    convert: Optional[Callable[[Any], Any]] = None

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT

    def parse(self, raw: Any) -> Any:
        """The typed, validated value; ``None`` stays ``None`` (no value: the default)."""
        if raw is None:
            return None
        value = _PARSERS[self.type](self.name, raw)
        if self.validator is not None:
            self.validator(self.name, value, raw)
        return self.convert(value) if self.convert is not None else value

    @property
    def value(self) -> Any:
        """The default as the Python value (``default`` is the config value, as docs show it)."""
        if self.required or self.default is None or self.convert is None:
            return self.default
        return self.parse(self.default)

    def default_text(self) -> str:
        if self.required:
            return ""
        if self.default is None:
            return "null"
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, (list, tuple)):
            return ",".join(map(str, self.default))
        return str(self.default)


@dataclass
class ConfigDef:
    """One family's table. ``what`` names the family in errors (``topic config``, …)."""
    what: str
    keys: Dict[str, ConfigKey] = field(default_factory=dict)

    def define(self, name: str, type: str, default: Any, doc: str, *,
               validator: Optional[Validator] = None, attr: Optional[str] = None,
               convert: Optional[Callable[[Any], Any]] = None) -> "ConfigDef":
        if name in self.keys:
            raise ValueError(f"{self.what} {name!r} defined twice")
        if type not in _PARSERS:
            raise ValueError(f"unknown config type {type!r}")
        key = ConfigKey(name, type, default, doc, validator,
                        attr or name.replace(".", "_").replace("-", "_"), convert)
        self.keys[name] = key
        return self

    def by_attr(self, attr: str) -> ConfigKey:
        for key in self.keys.values():
            if key.attr == attr:
                return key
        raise KeyError(attr)

    def attrs(self) -> List[str]:
        return [k.attr for k in self.keys.values()]

    def __contains__(self, name: str) -> bool:
        return name in self.keys

    def __getitem__(self, name: str) -> ConfigKey:
        return self.keys[name]

    def names(self) -> List[str]:
        return list(self.keys)

    def unknown(self, name: str) -> InvalidConfigError:
        return InvalidConfigError(f"unknown {self.what} {name!r}; known: {sorted(self.keys)}")

    def parse_value(self, name: str, raw: Any) -> Any:
        if name not in self.keys:
            raise self.unknown(name)
        return self.keys[name].parse(raw)

    def parse(self, props: Optional[Mapping[str, Any]], *, unknown: str = "error",
              defaults: bool = False, by_attr: bool = False,
              ignore: Iterable[str] = ()) -> Dict[str, Any]:
        """Parse ``props``. An unknown name is an error (``unknown="error"``, where Kafka makes
        it one), a warning (``"warn"``, where Spark ignores it) or skipped (``"ignore"``, for
        names another table owns: ``ignore`` names a few, or the caller filtered). With
        ``defaults``, every key not given gets its default; a required key not given is an
        error. ``by_attr`` keys the result by each key's Python name."""
        out: Dict[str, Any] = {}
        skip = set(ignore)
        for name, raw in (props or {}).items():
            if name in skip:
                continue
            key = self.keys.get(name)
            if key is None:
                if unknown == "error":
                    raise self.unknown(name)
                if unknown == "warn":
                    log.warning("ignoring unknown %s %r", self.what, name)
                continue
            value = key.parse(raw)
            if value is not None:
                out[key.attr if by_attr else name] = value
        if defaults:
            for key in self.keys.values():
                slot = key.attr if by_attr else key.name
                if slot in out:
                    continue
                if key.required:
                    raise InvalidConfigError(f"missing required {self.what} {key.name!r}")
                out[slot] = key.value
        return out

    def defaults(self, by_attr: bool = False) -> Dict[str, Any]:
        """Every default, as Python values (see :attr:`ConfigKey.value`)."""
        return {(k.attr if by_attr else k.name): k.value
                for k in self.keys.values() if not k.required}

    def markdown_table(self, names: Optional[Sequence[str]] = None) -> str:
        """The docs' table of this family (tests hold docs/ against it)."""
        rows = ["| name | type | default | valid values | description |",
                "| --- | --- | --- | --- | --- |"]
        for key in (self.keys[n] for n in (names or self.keys)):
            valid = (str(key.validator) if isinstance(key.validator, (Range, OneOf, Check))
                     else "")
            rows.append(f"| `{key.name}` | {key.type} | `{key.default_text()}` | {valid} | "
                        f"{key.doc} |")
        return "\n".join(rows)

    def help_text(self, name: str) -> str:
        """A key's one line for ``--help``: its doc and default."""
        key = self.keys[name]
        default = key.default_text()
        return f"{key.doc} (default {default})" if default else key.doc
