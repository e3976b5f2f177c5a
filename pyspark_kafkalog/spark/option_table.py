"""A family of Spark options (``format("kafkalog")`` reads, writes) as one
:class:`~pyspark_kafkalog.config_def.ConfigDef`: each option declared once, with its type,
default, validator and one-line doc; parsing, errors, the unknown-option warning and the docs'
tables (``tests/spark/test_option_tables.py``) come from it.

What Spark's options add to Kafka's ``ConfigDef``:

- names are case-insensitive (Spark's ``CaseInsensitiveMap``): :meth:`OptionTable.lookup`;
- an option may be a *family* by prefix (``storage.<name>``, ``kafka.<consumer config>``): one
  row of the table, found for every name with its prefix;
- an option has a *kind*: ``supported``, ``streaming`` (only streams act on it), ``no-op``
  (accepted and ignored: client tuning of a broker connection that does not exist) or
  ``rejected`` (an error giving the reason, where Spark's connector rejects it too or where
  ignoring it would do the wrong thing);
- an option with structure (offsets JSON, byte sizes, durations) has a custom ``parser``
  ``(name, raw) -> value``, registered on its row;
- an unknown option is ignored with a warning naming the closest known name, as Spark's Kafka
  connector ignores options it does not know (:meth:`OptionTable.warn_unknown`).
"""
from __future__ import annotations

import dataclasses
import difflib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional

from ..config_def import BOOLEAN, DOUBLE, INT, LONG, ConfigDef, ConfigKey, OneOf, Range
from ..errors import InvalidConfigError

log = logging.getLogger(__name__)

SUPPORTED, STREAMING, NO_OP, REJECTED = "supported", "streaming", "no-op", "rejected"

#: what the value of a type must be, for the family's error message
_TYPE_RULE = {BOOLEAN: "true or false", INT: "an integer", LONG: "an integer",
              DOUBLE: "a number"}


@dataclass(frozen=True)
class Option:
    """What a table row adds to its :class:`ConfigKey`."""
    kind: str = SUPPORTED
    parser: Optional[Callable[[str, Any], Any]] = None
    #: a family of options by this (lower-case) prefix, e.g. ``storage.``
    prefix: Optional[str] = None
    #: test-only, left out of the docs
    hidden: bool = False


class OptionTable:
    """One family of Spark options. ``error(name, raw, rule)`` makes the family's
    :class:`InvalidConfigError` for a bad value (``rule`` completes "must be")."""

    def __init__(self, what: str, where: str, table: str,
                 error: Callable[[str, Any, str], InvalidConfigError]):
        self.config = ConfigDef(what)
        #: what the options are of (``format('kafkalog') reads``), and where the table is
        self.where, self.table = where, table
        self.error = error
        self.options: Dict[str, Option] = {}
        self._lower: Dict[str, str] = {}
        self._prefixes: Dict[str, str] = {}

    # -- the table ------------------------------------------------------------------------

    def define(self, name: str, type: str, default: Any, doc: str, *, kind: str = SUPPORTED,
               validator=None, attr: Optional[str] = None,
               parser: Optional[Callable[[str, Any], Any]] = None,
               prefix: Optional[str] = None, hidden: bool = False) -> "OptionTable":
        self.config.define(name, type, default, doc, validator=validator, attr=attr)
        self.options[name] = Option(kind, parser, prefix and prefix.lower(), hidden)
        self._lower[name.lower()] = name
        if prefix:
            self._prefixes[prefix.lower()] = name
        return self

    def keys(self) -> List[ConfigKey]:
        return list(self.config.keys.values())

    def __getitem__(self, name: str) -> ConfigKey:
        return self.config[name]

    def lookup(self, name: str) -> Optional[ConfigKey]:
        """The row of an option name in any case: its own, else its prefix family's (the
        longest prefix), else None."""
        lower = str(name).lower()
        if lower in self._lower:
            return self.config[self._lower[lower]]
        best = max((p for p in self._prefixes if lower.startswith(p) and len(lower) > len(p)),
                   key=len, default=None)
        return self.config[self._prefixes[best]] if best is not None else None

    def kind(self, name: str) -> str:
        return self.options[name].kind

    def default(self, name: str) -> Any:
        """The default of a row as its Python value (a custom parser's result for options
        with structure)."""
        key = self.config[name]
        parser = self.options[name].parser
        if key.default is None or key.required or parser is None:
            return key.default
        return parser(name, key.default)

    # -- values ---------------------------------------------------------------------------

    def parse(self, name: str, raw: Any) -> Any:
        """The typed, validated value of option ``name`` (its canonical spelling), or the
        family's :class:`InvalidConfigError` naming it and the value."""
        key = self.config[name]
        parser = self.options[name].parser
        if parser is not None:
            value = parser(name, raw)
            if key.validator is not None:
                try:
                    key.validator(name, value, raw)
                except InvalidConfigError as e:
                    raise self._validator_error(key, raw, value, e) from None
            return value
        try:
            return key.parse(raw)
        except InvalidConfigError as e:
            error = e
        try:      # which rule it broke: the type's, or the validator's
            value = dataclasses.replace(key, validator=None).parse(raw)
        except InvalidConfigError:
            raise self.error(name, raw, _TYPE_RULE.get(key.type, f"a {key.type}")) from None
        raise self._validator_error(key, raw, value, error) from None

    def _validator_error(self, key: ConfigKey, raw: Any, value: Any,
                         error: InvalidConfigError) -> InvalidConfigError:
        """The family's message for config_def's validators; a custom one's own error."""
        if isinstance(key.validator, (Range, OneOf)):
            return self.error(key.name, raw, _validator_rule(key.validator, value))
        return error

    def get(self, opts: Dict[str, Any], name: str) -> Any:
        """The parsed value of ``name`` in lower-cased ``opts``, or its default."""
        lower = name.lower()
        if lower in opts:
            return self.parse(name, opts[lower])
        return self.default(name)

    # -- unknown options ------------------------------------------------------------------

    def close_match(self, name: str, extra: Iterable[str] = ()) -> Optional[str]:
        """The known name a misspelt one most likely meant (difflib), or None."""
        known = {k.lower(): k for k in self.config.names()
                 if self.options[k].prefix is None and not self.options[k].hidden}
        known.update((k.lower(), k) for k in extra)
        close = difflib.get_close_matches(str(name).lower(), list(known), n=1)
        return known[close[0]] if close else None

    def unknown_message(self, name: str, raw: Any, extra: Iterable[str] = ()) -> str:
        close = self.close_match(name, extra)
        hint = f"; did you mean {close}?" if close else ""
        return (f"unknown option {name}={raw!r} for {self.where}, ignored as Spark's Kafka "
                f"connector ignores options it does not know{hint} (the options table is in "
                f"{self.table})")

    def warn_unknown(self, unknown: Dict[str, Any], extra: Iterable[str] = ()) -> List[str]:
        """Log one WARNING per unknown option (a parse with validation runs once per read or
        write); the messages."""
        messages = [self.unknown_message(name, raw, extra) for name, raw in unknown.items()]
        for message in messages:
            log.warning("%s", message)
        return messages


def _validator_rule(validator, value) -> str:
    if isinstance(validator, Range):
        if validator.low is not None and value < validator.low:
            return f">= {validator.low}"
        return f"<= {validator.high}"
    return "one of " + ", ".join(validator.choices)


def lower_text(name: str, raw: Any) -> str:
    """A keyword option's value as compared: stripped, lower case."""
    return str(raw).strip().lower()


def raw_text(name: str, raw: Any) -> str:
    """A value taken as given (an id, a path: not stripped)."""
    return str(raw)
