"""Scalar fields of the coordinator RPC's protobuf messages to and from dicts by field name
(``rpc_schema``, ``rpc_fetch_schema``).

Why by hand and not ``google.protobuf.json_format``: that writes 64-bit integers as strings and
drops presence, and the dicts must be the JSON bodies handlers were written for, where an int is
an int and a missing field differs from a null one.
"""
from __future__ import annotations

from google.protobuf.message import Message

from ..errors import InvalidRequestError


def text_bytes(text: str) -> bytes:
    """A ``bytes`` field of this schema is text that may hold a lone surrogate (a JSON string
    can, and a client id did before the schema): UTF-8 with those as their three bytes."""
    return text.encode("utf-8", "surrogatepass")


def bytes_text(data: bytes) -> str:
    """:func:`text_bytes` undone; ``UnicodeDecodeError`` (a ``ValueError``) for other bytes."""
    return data.decode("utf-8", "surrogatepass")


def put(msg: Message, values: dict, what: str, error=InvalidRequestError) -> Message:
    """Set ``msg``'s scalar fields from ``values`` (None or absent: unset)."""
    for field in msg.DESCRIPTOR.fields:
        if field.message_type is not None or field.is_repeated:
            continue
        value = values.get(field.name)
        if value is None:
            continue
        try:
            if field.type == field.TYPE_BOOL and not isinstance(value, bool):
                raise TypeError("not a boolean")
            if isinstance(value, bool) and field.type != field.TYPE_BOOL:
                raise TypeError("a boolean")
            if field.type == field.TYPE_BYTES and isinstance(value, str):
                value = text_bytes(value)
            setattr(msg, field.name, value)
        except (TypeError, ValueError) as exc:
            raise error(f"{what}: {field.name} cannot be {value!r} ({exc})") from None
    return msg


def get(msg: Message, absent_is_none: bool) -> dict:
    """``msg``'s scalar fields; an unset optional one is None (``absent_is_none``, a response)
    or left out (a request: the handler finds it missing, as in a JSON body without it)."""
    out = {}
    for field in msg.DESCRIPTOR.fields:
        if field.message_type is not None or field.is_repeated:
            continue
        if field.has_presence and not msg.HasField(field.name):
            if absent_is_none:
                out[field.name] = None
            continue
        value = getattr(msg, field.name)
        out[field.name] = bytes_text(value) if field.type == field.TYPE_BYTES else value
    return out
