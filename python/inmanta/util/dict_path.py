"""inmanta.util.dict_path: paths into nested dicts and lists, e.g. `a.b[name=x][port=80].c`.

This is Steward's own implementation of the path language of inmanta-core 14's
`inmanta.util.dict_path` (written against its behaviour, not copied from it). Inmanta modules
use it to edit structured files: the `files` module's `JsonFile`/`HostFile` handlers and the
`fs` module's `json_file` handler.

The language, in short:

* A path is a sequence of segments separated by `.`; `.` alone is the container itself, a
  leading `.` is ignored and empty segments (`a..b`) are skipped.
* A segment is either a dictionary key (`a`) or a keyed list (`a[k=v]`, `a[k=v][x=y]`): the
  items of the list stored under `a` that are dicts containing all the given key-value pairs.
* The characters `\\ [ ] . * =` are special; inside a key or value they are escaped with a
  backslash (`a\\.b` is the key `a.b`). A value of just `\\0` means `None`.
* Wild paths (`to_wild_path`) may use `*` as a whole key or a whole value; `get_elements`
  returns every match and `resolve_wild_cards` the wild-card-free paths behind the matches.
  Plain paths (`to_path`) address one place: `get_element`, `set_element` and `remove`.
* Keys and values are compared as strings (`[port=80]` matches `"80"` and `80`), and
  numerically when the path's text parses as a float and the data is an int or float (`[x=1]`
  matches `1.0` and `True`).
"""

from __future__ import annotations

import abc
import itertools
import logging
import re
from typing import Optional, Sequence, Union

LOGGER = logging.getLogger(__name__)

SPECIAL_CHARACTERS = ["\\", "[", "]", ".", "*", "="]
_SPECIAL = re.escape("".join(SPECIAL_CHARACTERS))
# one data character: an ordinary character or a backslash-escaped special one
_CHAR = rf"(?:[^{_SPECIAL}]|\\[{_SPECIAL}])"
_KEY = rf"{_CHAR}+|\*"
_PAIR = rf"\[({_KEY})=({_CHAR}*|\*|\\0)\]"
_IN_DICT_RE = re.compile(_KEY)
_KEYED_LIST_RE = re.compile(rf"({_CHAR}+)((?:{_PAIR})+)")
_PAIR_RE = re.compile(_PAIR)
# a segment runs up to the next unescaped dot
_SEGMENT_RE = re.compile(r"(?:[^.\\]|\\.)+")
_UNESCAPED_SPECIAL_RE = re.compile(rf"([{_SPECIAL}])")
_ESCAPED_SPECIAL_RE = re.compile(rf"\\([{_SPECIAL}])")


class InvalidPathException(Exception):
    """The path could not be parsed."""


class ContainerStructureException(LookupError):
    """A container on the path is not of the type the path expects (dict or list)."""


def _as_dict(container: object) -> dict:
    if not isinstance(container, dict):
        raise ContainerStructureException(f"{container} is not a Dict")
    return container


def _as_list(container: object) -> list:
    if not isinstance(container, list):
        raise ContainerStructureException(f"{container} is not a List or Set")
    return container


def _no_wild_card() -> ValueError:
    return ValueError(f"The Wildcard ('{WildCardValue.WILDCARD_CHARACTER}') can not be used in DictPath's")


# ----------------------------------------------------------------------------------- values


class DictPathValue(abc.ABC):
    """A key or value written in a path: a literal, the wild card `*` or the null value `\\0`."""

    @abc.abstractmethod
    def escape(self) -> str:
        """This value as written in a path (special characters escaped)."""

    @abc.abstractmethod
    def matches(self, value: Optional[object]) -> bool:
        """Whether a key or value found in the data matches this one."""

    @property
    @abc.abstractmethod
    def value(self) -> Optional[str]:
        """The literal (unescaped) value."""

    @classmethod
    def create(cls, value: str) -> DictPathValue:
        """From the text of a path (escaped)."""
        if value == WildCardValue.WILDCARD_CHARACTER:
            return WildCardValue()
        if value == NullValue.NULL_VALUE_CHARACTER:
            return NullValue()
        return NormalValue(_ESCAPED_SPECIAL_RE.sub(r"\1", value))

    @classmethod
    def from_object(cls, value: object) -> DictPathValue:
        """From a data value, taken literally: `None` or `str(value)`."""
        return NullValue() if value is None else NormalValue(str(value))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, self.__class__)


class NormalValue(DictPathValue):
    """A literal value, matched as a string or, when both sides are numbers, numerically."""

    def __init__(self, value: str) -> None:
        self._value = value
        try:
            self._numeric_value: Optional[float] = float(value)
        except (TypeError, ValueError):
            self._numeric_value = None

    def escape(self) -> str:
        return _UNESCAPED_SPECIAL_RE.sub(r"\\\1", self._value)

    def matches(self, value: Optional[object]) -> bool:
        if value is None:
            return False
        if self._numeric_value is not None and isinstance(value, (int, float)):
            return self._numeric_value == value
        return self._value == str(value)

    @property
    def value(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NormalValue) and self._value == other._value


class WildCardValue(DictPathValue):
    """`*`: matches anything."""

    WILDCARD_CHARACTER = "*"

    def escape(self) -> str:
        return self.WILDCARD_CHARACTER

    def matches(self, value: Optional[object]) -> bool:
        return True

    @property
    def value(self) -> str:
        raise Exception("A WildCardValue doesn't have an actual data value.")


class NullValue(DictPathValue):
    """`\\0`: matches `None` only."""

    NULL_VALUE_CHARACTER = r"\0"

    def escape(self) -> str:
        return self.NULL_VALUE_CHARACTER

    def matches(self, value: Optional[object]) -> bool:
        return value is None

    @property
    def value(self) -> None:
        return None


# ------------------------------------------------------------------------------ wild paths


class WildDictPath(abc.ABC):
    """A path that may use wild cards, so it addresses any number of elements."""

    SPECIAL_CHARACTERS = SPECIAL_CHARACTERS
    PATTERN_SPECIAL_CHARACTER = _UNESCAPED_SPECIAL_RE
    PATTERN_ESCAPED_SPECIAL_CHARACTER = _ESCAPED_SPECIAL_RE
    WILDCARD = WildCardValue.WILDCARD_CHARACTER

    @abc.abstractmethod
    def get_elements(self, container: object) -> list:
        """All elements of `container` this path matches (possibly none)."""

    def resolve_wild_cards(self, container: object) -> Sequence[WildDictPath]:
        """One wild-card-free path per way this path matches inside `container`."""
        raise NotImplementedError(f"resolve_wild_cards is not supported on {type(self).__name__}")

    @abc.abstractmethod
    def to_str(self) -> str:
        """The path expression."""

    def __str__(self) -> str:
        return self.to_str()

    def __add__(self, other: object) -> WildDictPath:
        if not isinstance(other, WildDictPath):
            return NotImplemented
        return WildComposedPath(path=[*self.get_path_sections(), *other.get_path_sections()])

    @abc.abstractmethod
    def get_path_sections(self) -> Sequence[WildDictPath]:
        """The single-segment paths this path consists of."""

    @classmethod
    @abc.abstractmethod
    def parse(cls, inp: str) -> Optional[WildDictPath]:
        """The path `inp` denotes, or None when it is not of this kind."""


class WildInDict(WildDictPath):
    """`key`: the value stored under a key of a dict; `*` matches every key."""

    def __init__(self, key: str) -> None:
        value = DictPathValue.create(key)
        if isinstance(value, NullValue):
            raise InvalidPathException(f"Invalid dictionary key {key}")
        self.key: Union[NormalValue, WildCardValue] = value

    def get_elements(self, container: object) -> list:
        return [v for k, v in _as_dict(container).items() if self.key.matches(k)]

    def resolve_wild_cards(self, container: object) -> Sequence[WildInDict]:
        # like inmanta-core, str(key) is taken as path text (so it is not escaped first)
        return [WildInDict(str(k)) for k in _as_dict(container) if self.key.matches(k)]

    def to_str(self) -> str:
        return self.key.escape()

    def get_path_sections(self) -> Sequence[WildDictPath]:
        return [self]

    @classmethod
    def parse(cls, inp: str) -> Optional[WildInDict]:
        return cls(inp) if _IN_DICT_RE.fullmatch(inp) else None

    def __eq__(self, other: object) -> bool:
        return other.__class__ == self.__class__ and self.key == other.key  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.__class__, self.key.escape()))


class WildKeyedList(WildDictPath):
    """`relation[k=v]...`: the dicts in the list stored under `relation` that hold every pair.

    Construct with `(relation, [(key, value), ...])`, or (deprecated) `(relation, key, value)`;
    keys and values are written as in a path (escaped)."""

    def __init__(
        self, relation: str, key_value_pairs: Union[str, Sequence[tuple[str, str]]], key_value: Optional[str] = None
    ) -> None:
        if isinstance(key_value_pairs, str):
            name = self.__class__.__name__
            LOGGER.warning(
                "The %s(relation, key_attribute, key_value) constructor is deprecated, use"
                " %s(relation, key_value_pairs: Sequence[Tuple[str, str]]) instead", name, name
            )
            assert key_value is not None
            key_value_pairs = [(key_value_pairs, key_value)]
        relation_value = DictPathValue.create(relation)
        if not isinstance(relation_value, NormalValue):
            raise InvalidPathException(f"Invalid relation name: {relation}")
        self.relation: NormalValue = relation_value
        if not key_value_pairs:
            raise ValueError("A keyed list path requires at least one key-value pair.")
        if len({key for key, _ in key_value_pairs}) != len(key_value_pairs):
            raise ValueError("No duplicate keys allowed in keyed list path")
        self.key_value_pairs: Sequence[tuple[DictPathValue, DictPathValue]] = [
            (self._parse_key(key), self._parse_value(value)) for key, value in key_value_pairs
        ]

    @classmethod
    def _parse_key(cls, key: str) -> DictPathValue:
        result = DictPathValue.create(key)
        if isinstance(result, NullValue):
            raise InvalidPathException(f"Invalid dictionary key name: {key}")
        return result

    @classmethod
    def _parse_value(cls, value: str) -> DictPathValue:
        return DictPathValue.create(value)

    def _selects(self, item: object) -> bool:
        return isinstance(item, dict) and all(
            any(key.matches(k) and value.matches(v) for k, v in item.items()) for key, value in self.key_value_pairs
        )

    def _list(self, container: object) -> Optional[list]:
        """The list under the relation; None when the key is absent."""
        outer = _as_dict(container)
        if self.relation.value not in outer:
            return None
        return _as_list(outer[self.relation.value])

    def get_elements(self, container: object) -> list:
        items = self._list(container)
        return [] if items is None else [item for item in items if self._selects(item)]

    def resolve_wild_cards(self, container: object) -> Sequence[WildKeyedList]:
        # what a wild card in a *key* should resolve to is not defined (nor in inmanta-core)
        if any(isinstance(key, WildCardValue) for key, _ in self.key_value_pairs):
            raise NotImplementedError(
                f"Can not call resolve_wild_cards on this path because it uses wild cards (`*`) for some of"
                f" its keys: `{self}`.  The desired behavior of resolve_wild_cards for this type of path is"
                " currently undefined."
            )
        items = self._list(container)
        result: list[WildKeyedList] = []
        for item in items or []:
            if not isinstance(item, dict):
                continue
            # per pair of the path, the item's matching pairs as path text (str(None) is "None")
            candidates = [
                [(str(k), str(v)) for k, v in item.items() if key.matches(k) and value.matches(v)]
                for key, value in self.key_value_pairs
            ]
            result.extend(WildKeyedList(self.relation.value, list(pairs)) for pairs in itertools.product(*candidates))
        return result

    def to_str(self) -> str:
        pairs = "".join(f"[{key.escape()}={value.escape()}]" for key, value in self.key_value_pairs)
        return self.relation.escape() + pairs

    def get_path_sections(self) -> Sequence[WildDictPath]:
        return [self]

    @classmethod
    def parse(cls, inp: str) -> Optional[WildKeyedList]:
        match = _KEYED_LIST_RE.fullmatch(inp)
        if not match:
            return None
        return cls(match.group(1), [(m.group(1), m.group(2)) for m in _PAIR_RE.finditer(match.group(2))])

    def get_key_value_pairs(self) -> Sequence[tuple[str, Optional[str]]]:
        """The literal (unescaped) key-value pairs."""
        return [(key.value, value.value) for key, value in self.key_value_pairs]

    def __eq__(self, other: object) -> bool:
        if other.__class__ != self.__class__:
            return False
        return self.relation == other.relation and self.key_value_pairs == other.key_value_pairs  # type: ignore


class WildComposedPath(WildDictPath):
    """A sequence of segments separated by dots. `str()` gives back the text it was parsed from."""

    element_types: Sequence[type] = [WildInDict, WildKeyedList]

    def __init__(self, path_str: Optional[str] = None, path: Optional[Sequence[WildDictPath]] = None) -> None:
        if (path_str is None) == (path is None):
            raise ValueError("Either path or path_str should be set")
        if path_str is not None:
            self.path = path_str
            self.expanded_path: Sequence[WildDictPath] = self.do_parse(path_str)
        else:
            assert path is not None
            self.expanded_path = path
            self.path = self.un_parse()

    def un_parse(self) -> str:
        return ".".join(element.to_str() for element in self.expanded_path)

    @classmethod
    def split_on_dots(cls, path_str: str) -> list[str]:
        """The segments of `path_str`: split on unescaped dots, empty segments dropped."""
        segments = _SEGMENT_RE.findall(path_str)
        if not segments:
            raise InvalidPathException(f"Could not parse path {path_str}")
        return segments

    @classmethod
    def do_parse(cls, path_str: str) -> Sequence[WildDictPath]:
        def parse_segment(segment: str) -> WildDictPath:
            for element_type in cls.element_types:
                parsed = element_type.parse(segment)
                if parsed is not None:
                    return parsed
            raise InvalidPathException(f"Could not parse path segment {segment}")

        return [parse_segment(segment) for segment in cls.split_on_dots(path_str)]

    @classmethod
    def parse(cls, inp: str) -> Optional[WildComposedPath]:
        try:
            return cls(path=cls.do_parse(inp))
        except InvalidPathException:
            return None

    def get_elements(self, container: object) -> list:
        if container is None:
            raise IndexError("Can not get anything from None")
        found = [container]
        for section in self.expanded_path:
            found = [element for parent in found for element in section.get_elements(parent)]
        return found

    def resolve_wild_cards(self, container: object) -> Sequence[WildComposedPath]:
        if container is None:
            raise IndexError("Can not get anything from None")
        if not self.expanded_path:
            return []
        first, rest = self.expanded_path[0], self.expanded_path[1:]
        result: list[WildComposedPath] = []
        for head in first.resolve_wild_cards(container):
            if not rest:
                result.append(WildComposedPath(path=[head]))
                continue
            for element in head.get_elements(container):
                for tail in WildComposedPath(path=rest).resolve_wild_cards(element):
                    result.append(WildComposedPath(path=[head, *tail.get_path_sections()]))
        return result

    def to_str(self) -> str:
        return self.path

    def get_path_sections(self) -> Sequence[WildDictPath]:
        return self.expanded_path

    def __eq__(self, other: object) -> bool:
        return other.__class__ == self.__class__ and self.expanded_path == other.expanded_path  # type: ignore


class WildNullPath(WildDictPath):
    """`.`: the container itself (which must be a dict)."""

    def get_elements(self, container: object) -> list:
        return [_as_dict(container)]

    def resolve_wild_cards(self, container: object) -> Sequence[WildNullPath]:
        _as_dict(container)
        return [WildNullPath()]

    def get_path_sections(self) -> Sequence[DictPath]:
        return []

    def to_str(self) -> str:
        return "."

    @classmethod
    def parse(cls, inp: str) -> None:
        raise NotImplementedError("NullPath is not intended to be parseable, it should only be used programmatically.")


# --------------------------------------------------------------------------- plain paths


class DictPath(WildDictPath):
    """A path without wild cards: it addresses (at most) one element, which can be read,
    written (`set_element`) or removed. `get_element(construct=True)` creates what is missing."""

    @abc.abstractmethod
    def get_element(self, container: object, construct: bool = False) -> object:
        """The element; KeyError when there is none (and `construct` is false) or several."""

    def get_elements(self, container: object) -> list:
        try:
            return [self.get_element(container, False)]
        except LookupError:
            return []

    @abc.abstractmethod
    def set_element(self, container: object, value: object, construct: bool = True) -> None:
        """Store `value` at this path (creating the containers leading to it if `construct`)."""

    def __add__(self, other: object) -> DictPath:
        if not isinstance(other, DictPath):
            return NotImplemented
        return ComposedPath(path=[*self.get_path_sections(), *other.get_path_sections()])

    def get_path_sections(self) -> Sequence[DictPath]:
        return []

    @abc.abstractmethod
    def get_key(self) -> str:
        """The dictionary key this segment refers to."""

    @abc.abstractmethod
    def remove(self, container: object) -> None:
        """Remove the addressed element (key of a dict, or items of a keyed list) if present."""


class InDict(DictPath, WildInDict):
    """`key`: the value stored under `key` in a dict."""

    def __init__(self, key: str) -> None:
        WildInDict.__init__(self, key)
        if isinstance(self.key, WildCardValue):
            raise _no_wild_card()

    def get_element(self, container: object, construct: bool = False) -> object:
        found = WildInDict.get_elements(self, container)
        if not found and construct:
            new: dict = {}
            _as_dict(container)[self.key.value] = new
            return new
        if len(found) != 1:
            raise KeyError(f"Found no or multiple items matching {self.to_str()} in {container}: {found}")
        return found[0]

    def set_element(self, container: object, value: object, construct: bool = True) -> None:
        _as_dict(container)[self.key.value] = value

    def get_path_sections(self) -> Sequence[DictPath]:
        return [self]

    def get_key(self) -> str:
        return self.key.value

    def remove(self, container: object) -> None:
        dct = _as_dict(container)
        for key in [k for k in dct if self.key.matches(k)]:
            del dct[key]


class KeyedList(DictPath, WildKeyedList):
    """`relation[k=v]...` selecting exactly one dict of the list."""

    @classmethod
    def _parse_key(cls, key: str) -> DictPathValue:
        result = super()._parse_key(key)
        if isinstance(result, WildCardValue):
            raise _no_wild_card()
        return result

    @classmethod
    def _parse_value(cls, value: str) -> DictPathValue:
        result = super()._parse_value(value)
        if isinstance(result, WildCardValue):
            raise _no_wild_card()
        return result

    def get_element(self, container: object, construct: bool = False) -> object:
        found = WildKeyedList.get_elements(self, container)
        if not found and construct:
            items = _as_list(_as_dict(container).setdefault(self.relation.value, []))
            new = {key.value: value.value for key, value in self.key_value_pairs}
            items.append(new)
            return new
        if len(found) != 1:
            raise KeyError(f"Found no or multiple items matching {self.to_str()} in {container}: {found}")
        return found[0]

    def set_element(self, container: object, value: object, construct: bool = True) -> None:
        # the list is created when missing, whatever `construct` says (as inmanta-core does)
        items = _as_list(_as_dict(container).setdefault(self.relation.value, []))
        try:
            current = self.get_element(container)
        except KeyError:
            items.append(value)
        else:
            items[items.index(current)] = value

    def get_path_sections(self) -> Sequence[DictPath]:
        return [self]

    def get_key(self) -> str:
        return self.relation.value

    def remove(self, container: object) -> None:
        items = self._list(container)
        if items is not None:
            container[self.relation.value] = [item for item in items if not self._selects(item)]  # type: ignore


class ComposedPath(DictPath, WildComposedPath):
    """Segments separated by dots, none of them wild."""

    element_types: Sequence[type] = [InDict, KeyedList]

    def get_element(self, container: object, construct: bool = False) -> object:
        found = WildComposedPath.get_elements(self, container)
        if not found and construct:
            for section in self.expanded_path:
                container = section.get_element(container, True)  # type: ignore[attr-defined]
            return container
        if len(found) != 1:
            raise KeyError(f"Found no or multiple items matching {self.to_str()} in {container}: {found}")
        return found[0]

    def set_element(self, container: object, value: object, construct: bool = True) -> None:
        sections = self.get_path_sections()
        for section in sections[:-1]:
            container = section.get_element(container, construct=construct)
        sections[-1].set_element(container, value)

    def get_path_sections(self) -> Sequence[DictPath]:
        return self.expanded_path  # type: ignore[return-value]

    def get_key(self) -> str:
        raise NotImplementedError("Method get_key() not supported on a ComposedPath")

    def remove(self, container: object) -> None:
        sections = self.get_path_sections()
        for section in sections[:-1]:
            try:
                container = section.get_element(container)
            except KeyError:
                return
        sections[-1].remove(container)


class NullPath(DictPath, WildNullPath):
    """`.`: the container itself; `set_element` replaces its content."""

    def get_element(self, container: object, construct: bool = False) -> dict:
        return _as_dict(container)

    def set_element(self, container: object, value: object, construct: bool = True) -> None:
        if not isinstance(container, dict):
            raise ContainerStructureException(f"Argument container is not a Dict: {container}")
        if not isinstance(value, dict):
            raise ContainerStructureException(f"Argument value is not a Dict: {value}")
        container.clear()
        container.update(value)

    def get_key(self) -> str:
        raise NotImplementedError("Method get_key() is not supported on a NullPath")

    def remove(self, container: object) -> None:
        raise NotImplementedError("Method remove() is not supported on a NullPath")


def _parse(inp: str, null: type, composed: type) -> WildDictPath:
    if inp == ".":
        return null()
    if inp.startswith("."):
        inp = inp[1:]  # a leading dot stands for the container itself
    try:
        return composed(path_str=inp)
    except ValueError as e:  # a wild card where none is allowed, duplicate keys, ...
        raise InvalidPathException(str(e))


def to_wild_path(inp: str) -> WildDictPath:
    """Parse a path that may contain wild cards. Raises InvalidPathException."""
    return _parse(inp, WildNullPath, WildComposedPath)


def to_path(inp: str) -> DictPath:
    """Parse a path without wild cards. Raises InvalidPathException."""
    return _parse(inp, NullPath, ComposedPath)  # type: ignore[return-value]
