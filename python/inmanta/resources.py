"""Resource definitions (`@resource` classes), as inmanta-core 14 has them.

A module declares how an entity of the model becomes a resource:

    @resource("mymod::File", agent="host.name", id_attribute="path")
    class File(PurgeableResource):
        fields = ("path", "content")

        @staticmethod
        def get_content(exporter, obj):
            return obj.content.strip()

At export (in Steward's plugin host) `Resource.create_from_model` builds the resource from a
proxy of the entity; in an executor `Resource.deserialize` rebuilds it from its JSON.
"""

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, Optional, TypeVar, Union

from inmanta.ast import CompilerException, ExplicitPluginException, ExternalException
from inmanta.execute import proxy, util


class _Logger:
    """`logging` costs an import at every compile; resources log almost never."""

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        import logging

        return getattr(logging.getLogger(__name__), name)


LOGGER = _Logger()

RESOURCE_ATTRIBUTE_SEND_EVENTS = "send_event"
RESOURCE_ATTRIBUTE_RECEIVE_EVENTS = "receive_events"

ResourceIdStr = str
ResourceVersionIdStr = str
JsonType = dict[str, Any]


class ResourceException(Exception):
    pass


T = TypeVar("T", bound="Resource")


class resource:  # noqa: N801
    """Registers a resource class for an entity type of the model.

    :param name: the entity (`mymod::File`)
    :param id_attribute: the attribute (may be mapped) that identifies the resource on its agent
    :param agent: a path of attributes (`host.name`) leading to the agent's name
    """

    _resources: dict[str, tuple[type["Resource"], dict[str, str]]] = {}

    def __init__(self, name: str, id_attribute: str, agent: str):
        if not isinstance(agent, str):
            raise ResourceException(f"The agent parameter has to be a string, got {agent} of type {type(agent)}")
        self._cls_name = name
        self._options = {"agent": agent, "name": id_attribute}

    def __call__(self, cls: type[T]) -> type[T]:
        if self._cls_name in resource._resources:
            LOGGER.info("Reloading module %s" % self._cls_name)
            del resource._resources[self._cls_name]
        resource._resources[self._cls_name] = (cls, self._options)
        return cls

    @classmethod
    def validate(cls) -> None:
        for res, _ in cls._resources.values():
            res.validate()

    @classmethod
    def get_entity_resources(cls) -> Iterable[str]:
        return cls._resources.keys()

    @classmethod
    def get_class(cls, name: str) -> tuple[Optional[type["Resource"]], Optional[dict[str, str]]]:
        if name in cls._resources:
            return cls._resources[name]
        return (None, None)

    @classmethod
    def get_resources(cls) -> Iterator[tuple[str, type["Resource"]]]:
        return ((name, definition) for name, (definition, _options) in cls._resources.items())

    @classmethod
    def reset(cls) -> None:
        cls._resources = {}


class ResourceNotFoundExcpetion(Exception):
    """A resource was not found."""


class IgnoreResourceException(Exception):
    """Raised (by a mapper) when a resource should not be exported, e.g. it is not managed."""


def to_id(entity: "proxy.DynamicProxy") -> Optional[str]:
    """The resource id of an entity instance of the model, or None when it is no resource."""
    entity_type = entity._type()
    cls = options = cls_name = None
    for cls_name in [str(entity_type)] + entity_type.get_all_parent_names():
        cls, options = resource.get_class(cls_name)
        if cls is not None:
            break
    if cls is not None and options is not None and cls_name is not None:
        return str(cls.object_to_id(entity, cls_name, options["name"], options["agent"]))
    return None


class ResourceMeta(type):
    @classmethod
    def _get_parent_fields(cls, bases: Sequence[type]) -> list[str]:
        fields: list[str] = []
        for base in bases:
            if "fields" in base.__dict__:
                if not isinstance(base.__dict__["fields"], (tuple, list)):
                    raise Exception("fields attribute of %s should be a tuple or list" % base)
                fields.extend(base.__dict__["fields"])
            fields.extend(cls._get_parent_fields(base.__bases__))
        return fields

    def __new__(cls, class_name, bases, dct):  # type: ignore[no-untyped-def]
        fields = cls._get_parent_fields(bases)
        if "fields" in dct:
            if not isinstance(dct["fields"], (tuple, list)):
                raise Exception("fields attribute of %s should be a tuple or list" % class_name)
            fields.extend(dct["fields"])
        # deduplicated, first occurrence order (inmanta uses a set: order is not part of the API)
        dct["fields"] = tuple(dict.fromkeys(fields))
        return type.__new__(cls, class_name, bases, dct)


RESERVED_FOR_RESOURCE = {"id", "version", "model", "requires", "unknowns", "set_version", "clone", "is_type", "serialize"}


def _json_default(o: object) -> object:
    if isinstance(o, util.Unknown):
        raise proxy.UnknownException(o)
    step = getattr(o, "json_serialization_step", None)
    if step is not None:
        return step()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, Id):
        return str(o)
    raise TypeError(f"{o!r} of type {type(o).__name__} is not JSON serializable")


class Resource(metaclass=ResourceMeta):
    """Base class of resource definitions; `fields` lists the fields (merged over the hierarchy),
    `get_<field>(exporter, obj)` static methods or `map` entries compute a field from the model."""

    fields: Sequence[str] = (RESOURCE_ATTRIBUTE_SEND_EVENTS, RESOURCE_ATTRIBUTE_RECEIVE_EVENTS)
    send_event: bool
    model: "proxy.DynamicProxy"
    map: dict[str, Callable[[Any, "proxy.DynamicProxy"], Any]]

    @staticmethod
    def get_send_event(_exporter: Any, obj: Any) -> bool:
        try:
            return obj.send_event
        except Exception:
            return False

    @staticmethod
    def get_receive_events(_exporter: Any, obj: Any) -> bool:
        try:
            return obj.receive_events
        except Exception:
            return True

    @classmethod
    def object_to_id(
        cls, model_object: "proxy.DynamicProxy", entity_name: str, attribute_name: str, agent_attribute: str
    ) -> "Id":
        agent_value: Any = model_object
        for el in agent_attribute.split("."):
            try:
                if isinstance(agent_value, (list, proxy.SequenceProxy)):
                    agent_value = agent_value[0]
                agent_value = getattr(agent_value, el)
            except (proxy.UnsetException, proxy.UnknownException):
                raise
            except Exception:
                raise Exception(
                    "Unable to get the name of agent %s belongs to. In path %s, '%s' does not exist"
                    % (model_object, agent_attribute, el)
                )
        attribute_value = cls.map_field(None, entity_name, attribute_name, model_object)
        if isinstance(attribute_value, util.Unknown):
            raise proxy.UnknownException(attribute_value)
        if not isinstance(agent_value, str):
            raise ResourceException(
                f"The agent attribute should lead to a string, got {agent_value} of type {type(agent_value)}"
            )
        return Id(entity_name, str(agent_value), attribute_name, str(attribute_value))

    @classmethod
    def map_field(cls, exporter: Any, entity_name: str, field_name: str, model_object: "proxy.DynamicProxy") -> Any:
        from inmanta import plugins

        try:
            if hasattr(cls, "get_" + field_name):
                value = getattr(cls, "get_" + field_name)(exporter, model_object)
            elif hasattr(cls, "map") and field_name in cls.map:
                value = cls.map[field_name](exporter, model_object)
            else:
                value = getattr(model_object, field_name)
            # weeds out unknowns deep in the value
            json.dumps(value, default=_json_default)
            return value
        except IgnoreResourceException:
            raise
        except proxy.UnknownException as e:
            return e.unknown
        except plugins.PluginException as e:
            raise ExplicitPluginException(None, f"Failed to get attribute '{field_name}' for export on '{entity_name}'", e)
        except CompilerException:
            raise
        except Exception as e:
            raise ExternalException(None, f"Failed to get attribute '{field_name}' for export on '{entity_name}'", e)

    @classmethod
    def create_from_model(cls, exporter: Any, entity_name: str, model_object: "proxy.DynamicProxy") -> "Resource":
        resource_cls, options = resource.get_class(entity_name)
        if resource_cls is None or options is None:
            raise TypeError("No resource class registered for entity %s" % entity_name)
        obj_id = resource_cls.object_to_id(model_object, entity_name, options["name"], options["agent"])
        fields = {field: resource_cls.map_field(exporter, entity_name, field, model_object) for field in resource_cls.fields}
        obj = resource_cls(obj_id)
        obj.populate(fields)
        obj.model = model_object
        return obj

    @classmethod
    def deserialize(cls, obj_map: JsonType) -> "Resource":
        obj_id = Id.parse_id(obj_map["id"])
        cls_resource, _options = resource.get_class(obj_id.entity_type)
        if cls_resource is None:
            raise TypeError("No resource class registered for entity %s" % obj_id.entity_type)
        if RESOURCE_ATTRIBUTE_RECEIVE_EVENTS not in obj_map:
            obj_map = {**obj_map, RESOURCE_ATTRIBUTE_RECEIVE_EVENTS: True}
        obj = cls_resource(obj_id)
        obj.populate(obj_map, False)
        return obj

    @classmethod
    def validate(cls) -> None:
        for field in cls.fields:
            if field.startswith("_"):
                raise ResourceException("Resource field names can not start with _, reported in %s" % cls.__name__)
            if field in RESERVED_FOR_RESOURCE:
                raise ResourceException(
                    f"Resource {field} is a reserved keyword and not a valid field name, reported in {cls.__name__}"
                )

    def __init__(self, _id: "Id") -> None:
        self.id = _id
        self.requires: set[Id] = set()
        self.resource_requires: set[Resource] = set()
        self.unknowns: set[str] = set()
        if not hasattr(self.__class__, "fields"):
            raise Exception("A resource should have a list of fields")
        for field in self.__class__.fields:
            setattr(self, field, None)
        self.version = _id.version

    def populate(self, fields: dict[str, Any], force_fields: bool = False) -> None:
        for field in self.__class__.fields:
            if field in fields or force_fields:
                setattr(self, field, fields[field])
            else:
                raise Exception("Resource with id {} does not have field {}".format(fields.get("id", self.id), field))
        if "requires" in fields:
            for require in fields["requires"]:
                self.requires.add(Id.parse_id(require))

    def set_version(self, version: int) -> None:
        self.version = version
        self.id.version = version

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, util.Unknown):
            self.unknowns.add(name)
        self.__dict__[name] = value

    def __str__(self) -> str:
        return str(self.id)

    def __repr__(self) -> str:
        return str(self)

    def clone(self: T, **kwargs: Any) -> T:
        res = Resource.deserialize(self.serialize())
        for k, v in kwargs.items():
            setattr(res, k, v)
        return res  # type: ignore[return-value]

    def serialize(self) -> JsonType:
        dictionary: dict[str, Any] = {}
        for field in self.__class__.fields:
            dictionary[field] = getattr(self, field)
        dictionary["requires"] = [str(x) for x in self.requires]
        dictionary["version"] = self.version
        dictionary["id"] = self.id.resource_version_str()
        return dictionary

    def is_type(self, type_name: str) -> bool:
        return str(self.model._type()) == type_name


class PurgeableResource(Resource):
    """See std::PurgeableResource."""

    fields = ("purged", "purge_on_delete")
    purged: bool
    purge_on_delete: bool


class DiscoveryResource(Resource):
    """See std::DiscoveryResource."""

    fields = ()


class ManagedResource(Resource):
    """See std::ManagedResource: an entity with `managed = false` is not exported."""

    fields = ("managed",)
    managed: bool

    @staticmethod
    def get_managed(exporter: Any, obj: Any) -> bool:
        if not obj.managed:
            raise IgnoreResourceException()
        return obj.managed


PARSE_ID_REGEX = re.compile(
    r"^(?P<id>(?P<type>(?P<ns>[\w-]+(::[\w-]+)*)::(?P<class>[\w-]+))\[(?P<hostname>[^,]+),"
    r"(?P<attr>[^=]+)=(?P<value>[^\]]+)\])(,v=(?P<version>[0-9]+))?$"
)

PARSE_RVID_REGEX = re.compile(
    r"^(?P<id>(?P<type>(?P<ns>[\w-]+(::[\w-]+)*)::(?P<class>[\w-]+))\[(?P<hostname>[^,]+),"
    r"(?P<attr>[^=]+)=(?P<value>[^\]]+)\]),v=(?P<version>[0-9]+)$"
)


class Id:
    """The id of a resource: `<type>[<agent>,<attribute>=<value>]` and optionally `,v=<version>`."""

    def __init__(self, entity_type: str, agent_name: str, attribute: str, attribute_value: str, version: int = 0) -> None:
        self._entity_type = entity_type
        self._agent_name = agent_name
        self._attribute = attribute
        self._attribute_value = attribute_value
        self._version = version

    def to_dict(self) -> JsonType:
        return {
            "entity_type": self._entity_type,
            "agent_name": self.agent_name,
            "attribute": self.attribute,
            "attribute_value": self.attribute_value,
            "version": self.version,
        }

    def get_entity_type(self) -> str:
        return self._entity_type

    def get_agent_name(self) -> str:
        return self._agent_name

    def get_attribute(self) -> str:
        return self._attribute

    def get_attribute_value(self) -> str:
        return self._attribute_value

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        if self._version > 0 and version != self._version:
            raise AttributeError("can't set attribute version")
        self._version = version

    def copy(self, *, version: int) -> "Id":
        return Id(self.entity_type, self.agent_name, self.attribute, self.attribute_value, version)

    def __str__(self) -> str:
        if self._version > 0:
            return self.resource_version_str()
        return self.resource_str()

    def __hash__(self) -> int:
        return hash(str(self))

    def __eq__(self, other: object) -> bool:
        return str(self) == str(other) and type(self) is type(other)

    def resource_str(self) -> ResourceIdStr:
        return f"{self._entity_type}[{self._agent_name},{self._attribute}={self._attribute_value}]"

    def resource_version_str(self) -> ResourceVersionIdStr:
        return f"{self._entity_type}[{self._agent_name},{self._attribute}={self._attribute_value}],v={self._version}"

    def __repr__(self) -> str:
        return str(self)

    def get_instance(self) -> Optional[Resource]:
        cls, _ = resource.get_class(self.entity_type)
        if cls is None:
            return None
        obj = cls(self)
        setattr(obj, self.attribute, self.attribute_value)
        return obj

    @classmethod
    def parse_resource_version_id(cls, resource_id: ResourceVersionIdStr) -> "Id":
        parsed = Id.parse_id(resource_id)
        if parsed.version == 0:
            raise ValueError(f"Version is missing from resource id: {resource_id}")
        return parsed

    @classmethod
    def parse_id(cls, resource_id: Union[ResourceVersionIdStr, ResourceIdStr], version: Optional[int] = None) -> "Id":
        result = PARSE_ID_REGEX.search(resource_id)
        if result is None:
            raise ValueError("Invalid id for resource %s" % resource_id)
        if version is None:
            version_match = result.group("version")
            version = int(version_match) if version_match is not None else 0
        return Id(result.group("type"), result.group("hostname"), result.group("attr"), result.group("value"), version)

    @classmethod
    def is_resource_version_id(cls, value: str) -> bool:
        return PARSE_RVID_REGEX.search(value) is not None

    @classmethod
    def is_resource_id(cls, value: str) -> bool:
        return PARSE_ID_REGEX.search(value) is not None

    def is_resource_version_id_obj(self) -> bool:
        return self.version != 0

    @classmethod
    def set_version_in_id(cls, id_str: Union[ResourceVersionIdStr, ResourceIdStr], new_version: int) -> ResourceVersionIdStr:
        return cls.parse_id(id_str).copy(version=new_version).resource_version_str()

    entity_type = property(get_entity_type)
    agent_name = property(get_agent_name)
    attribute = property(get_attribute)
    attribute_value = property(get_attribute_value)
    version = property(get_version, set_version)


class HostNotFoundException(Exception):
    """The agent can not reach a host to manage a resource."""

    def __init__(self, hostname: str, user: str, error: str) -> None:
        super().__init__(f"Failed to access host {hostname} as user {user}: {error}")
        self.hostname = hostname
        self.user = user
        self.error = error
