"""Values of the Inmanta runtime that plugins can see: unknowns and the null value."""

from collections.abc import Iterator


class AnyType:
    """Supertype for objects that are an instance of all types."""


class Unknown(AnyType):
    """A value that can not be determined yet (during this compile).

    :param source: the source object that can determine the value
    """

    def __init__(self, source: object) -> None:
        self.source = source

    def __iter__(self) -> Iterator[object]:
        return iter([])

    def __repr__(self) -> str:
        return "Unknown"


class NoneValue:
    """The model's `null`."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NoneValue)

    def __hash__(self) -> int:
        return hash(None)

    def __str__(self) -> str:
        return "null"

    def __repr__(self) -> str:
        return "null"
