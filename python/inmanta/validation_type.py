"""inmanta.validation_type: pydantic-backed value validation (`std::validate_type`, the
`regex_string` types of std and config), as inmanta-core 14's.

pydantic is imported on first use only: a compile that validates nothing does not pay for
it. It is a dependency of inmanta-core, so it is in every environment pip made for a project
that requires an Inmanta module.
"""

import importlib
import inspect
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Mapping, Optional


@dataclass
class Regex:
    """A string constraint checked with Python's `re.match` (lookaround included)."""

    pattern: str

    def __get_pydantic_core_schema__(self, source_type: object, handler: Any) -> Any:
        from pydantic_core import PydanticCustomError, core_schema

        regex = re.compile(self.pattern)

        def match(v: str) -> str:
            if not regex.match(v):
                raise PydanticCustomError(
                    "string_pattern_mismatch",
                    "String should match pattern '{pattern}'",
                    {"pattern": self.pattern},
                )
            return v

        return core_schema.no_info_after_validator_function(match, handler(source_type))

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> Any:
        json_schema = handler(core_schema)
        json_schema["pattern"] = self.pattern
        return json_schema

    def __hash__(self) -> int:
        return hash(self.pattern)


def regex_string(regex: str) -> object:
    """A pydantic string type whose values must match `regex` (Python's `re`)."""
    return Annotated[str, Regex(regex)]


def parametrize_type(
    base_type: Any,
    validation_parameters: Optional[Mapping[str, object]] = None,
    *,
    type_name: Optional[str] = None,
) -> object:
    """`base_type` with `validation_parameters` applied (a pydantic `con*` function is called
    with them; pydantic v1's `regex` becomes a [`Regex`])."""
    import pydantic

    type_name = type_name if type_name is not None else repr(base_type)
    annotations: list[object] = []
    params = dict(validation_parameters) if validation_parameters is not None else {}
    if base_type is pydantic.constr and "regex" in params:
        regex = params.pop("regex")
        if regex is not None:
            annotations.append(Regex(str(regex)))
    if inspect.isroutine(base_type):
        made = base_type(**params)
    elif params:
        raise ValueError(f"got validation parameters {params} but {type_name} does not accept parameters")
    else:
        made = base_type
    return made if not annotations else Annotated[(made, *annotations)]


class _Key:
    """Validation parameters as a cache key (by identity, then by value)."""

    def __init__(self, params: Optional[Mapping[str, object]]) -> None:
        from inmanta.execute.proxy import DictProxy

        if isinstance(params, DictProxy):
            params = DictProxy.unwrap(params)
        self.params = params

    def __hash__(self) -> int:
        return id(self.params)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self.params == other.params


def validate_type(fq_type_name: str, value: object, validation_parameters: Optional[Mapping[str, object]] = None) -> None:
    """Check `value` against the type `fq_type_name` (`pydantic.*`, `datetime.*`,
    `ipaddress.*`, `uuid.*`) with `validation_parameters`; raises `ValueError` for an unknown
    type and pydantic's `ValidationError` for a value that does not pass."""
    if not fq_type_name.startswith(("pydantic.", "datetime.", "ipaddress.", "uuid.")):
        raise ValueError(f"Unknown fq_type_name: {fq_type_name}")
    _adapter(fq_type_name, _Key(validation_parameters)).validate_python(value)


@lru_cache(maxsize=4096)
def _adapter(fq_type_name: str, key: _Key) -> Any:
    import pydantic

    module_name, type_name = fq_type_name.split(".", 1)
    requested = getattr(importlib.import_module(module_name), type_name)
    return pydantic.TypeAdapter(parametrize_type(requested, key.params, type_name=fq_type_name))
