"""inmanta.util: the helpers module code reaches for (JSON encoding of values crossing an API
boundary); `inmanta.util.dict_path` is a submodule."""

import dataclasses
import datetime
import enum
import uuid
from abc import ABC, abstractmethod
from typing import Any


class JSONSerializable(ABC):
    """Instances know how to become JSON: `json_serialization_step` returns something closer
    to plain JSON (called until it is)."""

    @abstractmethod
    def json_serialization_step(self) -> Any:
        raise NotImplementedError()


def _utc_iso(o: datetime.datetime, tz_aware: bool) -> str:
    if o.tzinfo is None:
        o = o.replace(tzinfo=datetime.timezone.utc)
    o = o.astimezone(datetime.timezone.utc)
    if not tz_aware:
        o = o.replace(tzinfo=None)
    return o.isoformat(timespec="microseconds")


def api_boundary_json_encoder(o: object, tz_aware: bool = True) -> Any:
    """As inmanta-core's: one encoding step of a value `json` can not encode by itself
    (naive datetimes are taken as UTC)."""
    if isinstance(o, datetime.datetime):
        return _utc_iso(o, tz_aware)
    return _custom_json_encoder(o)


def _custom_json_encoder(o: object) -> Any:
    if isinstance(o, JSONSerializable):
        return o.json_serialization_step()
    if isinstance(o, uuid.UUID):
        return str(o)
    if isinstance(o, datetime.datetime):
        return o.isoformat(timespec="microseconds")
    if hasattr(o, "to_dict"):
        return o.to_dict()  # type: ignore[attr-defined]
    if isinstance(o, enum.Enum):
        return o.name
    if isinstance(o, Exception):
        return str(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    raise TypeError(repr(o) + " is not JSON serializable")


custom_json_encoder = _custom_json_encoder


def internal_json_encoder(o: object) -> Any:
    """As inmanta-core's: one encoding step for values that stay inside (naive datetimes are
    taken as local time and get their offset)."""
    if isinstance(o, datetime.datetime):
        return _custom_json_encoder(o if o.tzinfo is not None else o.astimezone())
    return _custom_json_encoder(o)


def _serializable_proxies() -> None:
    # as inmanta-core's: lists and dicts from the model encode as JSON through these encoders
    # (std's json_dumps passes them to json.dumps). Registered here rather than in the proxy
    # module, which every plugin host imports at start: this module's imports (dataclasses,
    # uuid, datetime) cost about 5 ms there, and only code that imports this module can ask
    # whether a value is JSONSerializable.
    from inmanta.execute.proxy import DictProxy, SequenceProxy

    JSONSerializable.register(SequenceProxy)
    JSONSerializable.register(DictProxy)


_serializable_proxies()
