"""Proxies through which plugin and mapper code sees the model, read-only.

In Steward the model lives in the compiler (Rust). The plugin host gives Python an
`Instance` per entity instance: a handle, its type, and the attributes the compiler sent
(already frozen). A read of any other attribute asks the compiler (see
`steward_plugin_host`); an attribute that is not frozen yet raises `UnsetException`, which
makes the compiler run the call again later, as Inmanta does.
"""

from collections.abc import Iterable, Mapping, Sequence
from copy import copy
from typing import Any, Callable, Optional, Union

from inmanta.ast import NotFoundException, RuntimeException
from inmanta.execute.util import NoneValue, Unknown


class UnsetException(RuntimeException):
    """An attribute read that is not available yet (not frozen)."""

    def __init__(self, msg: str, instance: Optional["Instance"] = None, attribute: Optional[str] = None) -> None:
        RuntimeException.__init__(self, None, msg)
        self.instance = instance
        self.attribute = attribute
        self.msg = msg

    def get_result_variable(self) -> Optional["Instance"]:
        return self.instance


class UnknownException(Exception):
    """A read of a value that is unknown in this compile."""

    def __init__(self, unknown: Unknown):
        super().__init__()
        self.unknown = unknown


class AttributeNotFound(NotFoundException, AttributeError):
    """No such attribute (an AttributeError too, so `hasattr` works)."""


class EntityType:
    """The type of an instance as plugins see it (`proxy._type()`)."""

    def __init__(self, name: str, parents: Sequence[str] = (), fields: Sequence[Sequence[Any]] = ()) -> None:
        self.name = name
        self.parents = list(parents)
        # [name, 0] for a plain attribute, [name, 1, low, high] for a relation end, inherited
        # ones included (the compiler sends them with the type)
        self.fields = [list(f) for f in fields]
        self._attributes: "Optional[dict[str, Any]]" = None

    def _attribute_map(self) -> "dict[str, Any]":
        if self._attributes is None:
            from inmanta.ast.attribute import Attribute, RelationAttribute

            attrs: dict[str, Any] = {}
            for f in self.fields:
                if f[1]:
                    a = RelationAttribute(self, None, f[0])
                    a.low = f[2]
                    a.high = f[3]
                    attrs[f[0]] = a
                else:
                    attrs[f[0]] = Attribute(self, None, f[0])
            self._attributes = attrs
        return self._attributes

    def get_all_attribute_names(self) -> list[str]:
        return list(self._attribute_map())

    def get_attribute(self, name: str) -> Any:
        """The attribute or relation end `name` (inherited ones too), None when there is none."""
        return self._attribute_map().get(name)

    def get_attributes(self) -> "dict[str, Any]":
        return dict(self._attribute_map())

    @property
    def attributes(self) -> "dict[str, Any]":
        return self._attribute_map()

    def get_full_name(self) -> str:
        return self.name

    def get_all_parent_names(self) -> list[str]:
        return list(self.parents)

    def get_namespace(self) -> str:
        return self.name.rsplit("::", 1)[0]

    def is_subclass(self, other: "EntityType") -> bool:
        return other.name in self.parents

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EntityType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


# Set by the plugin host: fetch(handle, attribute) -> decoded value, raising UnsetException
# (not frozen) or AttributeNotFound.
_fetch: Optional[Callable[[int, str], Any]] = None


class Instance:
    """An entity instance of the compiler's model, by handle."""

    __slots__ = ("handle", "type", "attributes", "__weakref__")

    def __init__(self, handle: int, type: EntityType) -> None:
        self.handle = handle
        self.type = type
        self.attributes: dict[str, Any] = {}

    def get_type(self) -> EntityType:
        return self.type

    def get_attribute_value(self, name: str) -> Any:
        try:
            return self.attributes[name]
        except KeyError:
            pass
        if _fetch is None:
            raise AttributeNotFound(None, name)
        value = _fetch(self.handle, name)
        self.attributes[name] = value
        return value

    def __hash__(self) -> int:
        return self.handle

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Instance) and other.handle == self.handle

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Instance):
            return NotImplemented
        return self.handle < other.handle

    def __repr__(self) -> str:
        return f"{self.type.name} {self.handle:x}"


class DynamicProxy:
    """Wraps a model value so that plugin code can never modify the model."""

    def __init__(self, instance: Any) -> None:
        object.__setattr__(self, "_DynamicProxy__instance", instance)

    def _get_instance(self) -> Any:
        return object.__getattribute__(self, "_DynamicProxy__instance")

    @classmethod
    def unwrap(cls, item: object) -> object:
        """From the plugin domain to the model domain."""
        if item is None:
            return NoneValue()
        if isinstance(item, DynamicProxy):
            return item._get_instance()
        if isinstance(item, (list, tuple)):
            return [cls.unwrap(x) for x in item]
        if isinstance(item, dict):
            out = {}
            for key, value in item.items():
                if not isinstance(key, str):
                    raise RuntimeException(
                        None, f"dict keys should be strings, got {key} of type {type(key)} with dict value {value}"
                    )
                out[key] = cls.unwrap(value)
            return out
        return item

    @classmethod
    def return_value(cls, value: object) -> Any:
        """From the model domain to the plugin domain."""
        if value is None or isinstance(value, NoneValue):
            return None
        if isinstance(value, Unknown):
            raise UnknownException(value)
        if isinstance(value, (str, tuple, int, float, bool)):
            return copy(value)
        if isinstance(value, DynamicProxy):
            return value
        if isinstance(value, dict):
            return DictProxy(value)
        if hasattr(value, "__len__"):
            return SequenceProxy(value)
        if callable(value):
            return CallProxy(value)
        return DynamicProxy(value)

    def __getattr__(self, attribute: str) -> Any:
        instance = self._get_instance()
        if not isinstance(instance, Instance):
            raise AttributeNotFound(None, attribute)
        return DynamicProxy.return_value(instance.get_attribute_value(attribute))

    def __setattr__(self, attribute: str, value: object) -> None:
        raise Exception("Readonly object")

    def _type(self) -> EntityType:
        return self._get_instance().type

    def is_unknown(self) -> bool:
        return isinstance(self._get_instance(), Unknown)

    def __hash__(self) -> int:
        return hash(self._get_instance())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DynamicProxy):
            other = other._get_instance()
        return self._get_instance() == other

    def __lt__(self, other: object) -> bool:
        if isinstance(other, DynamicProxy):
            other = other._get_instance()
        return self._get_instance() < other

    def __repr__(self) -> str:
        return "@%s" % repr(self._get_instance())


class SequenceProxy(DynamicProxy):
    def __init__(self, iterator: Sequence) -> None:
        DynamicProxy.__init__(self, iterator)

    def __getitem__(self, key: Union[int, slice]) -> object:
        instance = self._get_instance()
        if isinstance(key, str):
            raise RuntimeException(self, f"can not get a attribute {key}, {self._get_instance()} is a list")
        return DynamicProxy.return_value(instance[key])

    def __len__(self) -> int:
        return len(self._get_instance())

    def __iter__(self) -> "IteratorProxy":
        return IteratorProxy(iter(self._get_instance()))

    def json_serialization_step(self) -> list:
        return [i for i in self]


class DictProxy(DynamicProxy, Mapping):
    def __init__(self, mydict: dict) -> None:
        DynamicProxy.__init__(self, mydict)

    def __getitem__(self, key: str) -> object:
        instance = self._get_instance()
        if not isinstance(key, str):
            raise RuntimeException(self, f"Expected string key, but got {key}, {self._get_instance()} is a dict")
        return DynamicProxy.return_value(instance[key])

    def __len__(self) -> int:
        return len(self._get_instance())

    def __iter__(self) -> "IteratorProxy":
        return IteratorProxy(iter(self._get_instance()))

    def json_serialization_step(self) -> dict:
        return {k: v for k, v in self.items()}


class CallProxy(DynamicProxy):
    """Proxies a value that implements __call__."""

    def __init__(self, instance: Callable[..., object]) -> None:
        DynamicProxy.__init__(self, instance)

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._get_instance()(*args, **kwargs)


class IteratorProxy(DynamicProxy):
    def __init__(self, iterator: Iterable[object]) -> None:
        DynamicProxy.__init__(self, iterator)

    def __iter__(self) -> "IteratorProxy":
        return self

    def __next__(self) -> object:
        return DynamicProxy.return_value(next(self._get_instance()))

