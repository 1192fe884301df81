"""Handlers of Inmanta modules (`@provider` classes), as inmanta-core 14 has them, run by
Steward's handler host in an executor.

The action logic is the module's own: `HandlerAPI.deploy` calls `execute` (and `do_reload`
when a requirement changed and the handler `can_reload`); `ResourceHandler.execute` runs
`pre`, `list_changes`/`check_resource`, `do_changes` and `post`; `CRUDHandler.execute` runs
`read_resource`, `calculate_diff` and `create_resource`/`update_resource`/`delete_resource`.
A dry-run calls only the read side. What happened is reported through the `HandlerContext`:
status, attribute changes, created/updated/purged, and log records with structured kwargs.
"""

import collections
import hashlib
import inspect
import json
import logging
import traceback
import typing
import uuid
from abc import ABC, abstractmethod
from collections import abc
from typing import Any, Callable, Generic, Optional, TypeVar, Union, cast

from inmanta import const, resources
from inmanta.agent.cache import AgentCache
from inmanta.const import ParameterSource, ResourceState

LOGGER = logging.getLogger(__name__)

T = TypeVar("T")
T_FUNC = TypeVar("T_FUNC", bound=Callable[..., Any])
TResource = TypeVar("TResource", bound=resources.Resource)
TPurgeableResource = TypeVar("TPurgeableResource", bound=resources.PurgeableResource)
ResourceIdStr = str
SimpleTypes = Union[str, int, float, bool, None, list, dict]


class provider:  # noqa: N801
    """Register a handler class for a resource type: `@provider("mymod::File", name="posix")`."""

    def __init__(self, resource_type: str, name: Optional[str] = None) -> None:
        self._resource_type = resource_type

    def __call__(self, function: type["ResourceHandler[TResource]"]) -> "type[ResourceHandler[TResource]]":
        Commander.add_provider(self._resource_type, function)
        return function


class SkipResource(Exception):
    """Raised by a handler to skip the resource (it is retried later) instead of failing it."""


class ResourcePurged(Exception):
    """Raised by `read_resource` when the resource does not exist."""


# the name older modules and the documentation use
ResourceNotFoundException = ResourcePurged


class InvalidOperation(Exception):
    """An operation on the context or handler that is not allowed (e.g. set_created twice)."""


class HandlerNotAvailableException(Exception):
    """The handler can not do its job (e.g. the API it talks to is down)."""


def cache(
    func: Optional[T_FUNC] = None,
    ignore: list[str] = [],
    timeout: Optional[int] = None,
    for_version: Optional[bool] = None,
    cache_none: bool = True,
    cacheNone: Optional[bool] = None,  # noqa: N803
    call_on_delete: Optional[Callable[[Any], None]] = None,
    evict_after_creation: float = 0.0,
    evict_after_last_access: float = 0.0,
) -> Union[T_FUNC, Callable[[T_FUNC], T_FUNC]]:
    """Memoize a handler method in the handler cache: the method's name and its arguments
    (a `resource` argument by its id, without version; `ignore` left out) form the key.

    `for_version=True` binds the entry to the model version being deployed: it is dropped when
    that version's deploy is done. `timeout`/`evict_after_creation`/`evict_after_last_access`
    set how long an entry stays; `call_on_delete(value)` runs when it goes."""

    def actual(f: Callable[..., object]) -> T_FUNC:
        myignore = set(ignore)
        myargs = list(inspect.signature(f).parameters.keys())[1:]

        def wrapper(self: "HandlerAPI[Any]", *args: object, **kwds: object) -> object:
            kwds.update(dict(zip(myargs, args)))

            def bound(**kwds: object) -> object:
                return f(self, **kwds)

            return self.cache._get_or_else(
                f.__name__,
                bound,
                for_version,
                timeout,
                evict_after_last_access,
                evict_after_creation,
                myignore,
                cacheNone if cacheNone is not None else cache_none,
                call_on_delete,
                kwds,
            )

        wrapper.__name__ = f.__name__
        wrapper.__doc__ = f.__doc__
        return cast(T_FUNC, wrapper)

    if func is None:
        return actual
    return actual(func)


class LoggerABC(ABC):
    """Logging with structured kwargs: `ctx.info("wrote %(path)s", path=p)`."""

    def critical(self, msg: str, *args: object, exc_info: bool = False, **kwargs: object) -> None:
        self._log_msg(logging.CRITICAL, msg, *args, exc_info=exc_info, **kwargs)

    def error(self, msg: str, *args: object, exc_info: bool = False, **kwargs: object) -> None:
        self._log_msg(logging.ERROR, msg, *args, exc_info=exc_info, **kwargs)

    def warning(self, msg: str, *args: object, exc_info: bool = False, **kwargs: object) -> None:
        self._log_msg(logging.WARNING, msg, *args, exc_info=exc_info, **kwargs)

    def info(self, msg: str, *args: object, exc_info: bool = False, **kwargs: object) -> None:
        self._log_msg(logging.INFO, msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: str, *args: object, exc_info: bool = False, **kwargs: object) -> None:
        self._log_msg(logging.DEBUG, msg, *args, exc_info=exc_info, **kwargs)

    def exception(self, msg: str, *args: object, exc_info: bool = True, **kwargs: object) -> None:
        self.error(msg, *args, exc_info=exc_info, **kwargs)

    @abstractmethod
    def _log_msg(self, level: int, msg: str, *args: object, exc_info: bool = False, **kwargs: object) -> None:
        raise NotImplementedError


class PythonLogger(LoggerABC):
    """`LoggerABC` over a `logging.Logger`."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def _log_msg(self, level: int, msg: str, *args: object, exc_info: bool = False, **kwargs: object) -> None:
        if args:
            raise Exception("Args not supported")
        if kwargs:
            self.logger.log(level, msg, kwargs, exc_info=exc_info)
        else:
            self.logger.log(level, msg, exc_info=exc_info)


def _jsonable(v: object) -> object:
    """A log kwarg as JSON: as is when it is, else its str (as inmanta-core does in production)."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (uuid.UUID, resources.Id)):
        return str(v)
    if hasattr(v, "value") and isinstance(getattr(v, "value"), str):  # enums
        return v.value  # type: ignore[attr-defined]
    return str(v)


# Steward keeps at most this much of an action's logs (src/executor/limits.rs, which cuts
# again by bytes): a handler logging a huge value must not send it whole to its executor.
_MAX_MESSAGE = 64 * 1024
_MAX_FIELDS = 64 * 1024
_MAX_LOGS = 1024 * 1024


def _cut(text: str, limit: int, what: str) -> str:
    if len(text) <= limit:
        return text
    keep = limit - 160
    return f"{text[:keep]} … [cut: {len(text) - keep} of {len(text)} characters dropped; {what} keeps at most {limit // 1024} KiB]"


def _bounded_fields(fields: dict[str, object]) -> tuple[dict[str, object], int]:
    """The fields with values too large for a record replaced by markers, and their size."""
    out: dict[str, object] = {}
    total = 0
    for k, v in fields.items():
        if isinstance(v, str):
            n = len(v) + 2
        else:
            try:
                n = len(json.dumps(v, default=str))
            except (TypeError, ValueError):
                n = 0
        if total + n > _MAX_FIELDS:
            v = f"[cut: a value of {n} bytes; a log record keeps at most {_MAX_FIELDS // 1024} KiB of fields]"
            n = len(v)
        out[k] = v
        total += len(k) + n
    return out, total


_LEVELS = {
    logging.CRITICAL: "error",
    logging.ERROR: "error",
    logging.WARNING: "warning",
    logging.INFO: "info",
    logging.DEBUG: "debug",
}


class HandlerContext(LoggerABC):
    """What a handler reports while it runs: status, changes, created/updated/purged, logs, facts."""

    def __init__(
        self,
        resource: resources.Resource,
        dry_run: bool = False,
        action_id: Optional[uuid.UUID] = None,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        self._resource = resource
        self._dry_run = dry_run
        self._cache: dict[str, Any] = {}
        self._purged = False
        self._updated = False
        self._created = False
        self._change = const.Change.nochange
        self._changes: dict[str, dict[str, object]] = {}
        self._action_id = action_id or uuid.uuid4()
        self._status: Optional[ResourceState] = None
        self._logs: list[dict[str, object]] = []
        # past _MAX_LOGS: the last records (where the error is) in a window, the count of
        # those dropped between
        self._log_bytes = 0
        self._tail: "collections.deque[tuple[int, dict[str, object]]]" = collections.deque()
        self._tail_bytes = 0
        self._dropped = 0
        self._dropped_bytes = 0
        self.logger = logger or LOGGER
        self._facts: list[dict[str, Any]] = []

    def set_fact(self, fact_id: str, value: str, expires: bool = True) -> None:
        self._facts.append(
            {
                "id": fact_id,
                "source": ParameterSource.fact.value,
                "value": value,
                "resource_id": self._resource.id.resource_str(),
                "expires": expires,
            }
        )

    @property
    def facts(self) -> list[dict[str, Any]]:
        return self._facts

    @property
    def action_id(self) -> uuid.UUID:
        return self._action_id

    @property
    def status(self) -> Optional[ResourceState]:
        return self._status

    @property
    def logs(self) -> list[dict[str, object]]:
        if not self._dropped and not self._tail:
            return self._logs
        marker = {
            "level": "warning",
            "message": f"{self._dropped} log records ({self._dropped_bytes} bytes) dropped here: an action keeps at most {_MAX_LOGS // (1024 * 1024)} MiB of logs",
            "fields": {"dropped_records": self._dropped, "dropped_bytes": self._dropped_bytes},
        }
        return self._logs + ([marker] if self._dropped else []) + [r for _, r in self._tail]

    def set_status(self, status: ResourceState) -> None:
        self._status = status

    def is_dry_run(self) -> bool:
        return self._dry_run

    def get(self, name: str) -> Any:
        return self._cache[name]

    def contains(self, key: str) -> bool:
        return key in self._cache

    def set(self, name: str, value: Any) -> None:
        self._cache[name] = value

    def _set_change(self, change: const.Change) -> None:
        if self._change is not const.Change.nochange:
            raise InvalidOperation(f"Unable to set {change} operation, {self._change} already set.")
        self._change = change

    def set_created(self) -> None:
        self._created = True
        self._set_change(const.Change.created)

    def set_purged(self) -> None:
        self._purged = True
        self._set_change(const.Change.purged)

    def set_updated(self) -> None:
        self._updated = True
        self._set_change(const.Change.updated)

    @property
    def changed(self) -> bool:
        return self._created or self._updated or self._purged

    @property
    def change(self) -> const.Change:
        return self._change

    def add_change(self, name: str, desired: object, current: object = None) -> None:
        self._changes[name] = {"current": current, "desired": desired}

    def add_changes(self, **kwargs: SimpleTypes) -> None:
        for field, value in kwargs.items():
            self._changes[field] = {"current": None, "desired": value}

    def fields_updated(self, fields: str) -> None:
        for field in fields:
            if field not in self._changes:
                self._changes[fields] = {"current": None, "desired": None}

    def update_changes(self, changes: dict[str, Any]) -> None:
        """Add changes: each a dict with "current" and "desired", a (current, desired) tuple,
        or an object with those attributes."""
        for attribute, change in changes.items():
            if isinstance(change, dict):
                self._changes[attribute] = {"current": change.get("current"), "desired": change.get("desired")}
            elif isinstance(change, tuple):
                if len(change) != 2:
                    raise InvalidOperation(
                        f"Reported changes for {attribute} not valid. Tuple changes should contain 2 element."
                    )
                self._changes[attribute] = {"current": change[0], "desired": change[1]}
            elif hasattr(change, "current") and hasattr(change, "desired"):
                self._changes[attribute] = {"current": change.current, "desired": change.desired}
            else:
                raise InvalidOperation(f"Reported changes for {attribute} not in a type that is recognized.")

    @property
    def changes(self) -> dict[str, dict[str, object]]:
        return self._changes

    def _log_msg(self, level: int, msg: str, *args: object, exc_info: bool = False, **kwargs: object) -> None:
        if len(args) > 0:
            raise Exception("Args not supported")
        if exc_info:
            kwargs["traceback"] = traceback.format_exc()
        fields, fields_size = _bounded_fields({str(k): _jsonable(v) for k, v in kwargs.items()})
        try:
            message = msg % kwargs if kwargs else msg
        except Exception:
            message = msg
        message = _cut(str(message), _MAX_MESSAGE, "a log message")
        self.logger.log(level, "resource %s: %s", self._resource.id, message)
        record = {
            "level": _LEVELS.get(level, "info" if level > logging.DEBUG else "debug"),
            "message": message,
            "fields": fields,
        }
        size = len(message) + fields_size + 64
        if self._log_bytes + size <= _MAX_LOGS * 3 // 4 and not self._tail:
            self._log_bytes += size
            self._logs.append(record)
            return
        self._tail.append((size, record))
        self._tail_bytes += size
        while self._tail_bytes > _MAX_LOGS // 4 and len(self._tail) > 1:
            gone, _ = self._tail.popleft()
            self._tail_bytes -= gone
            self._dropped += 1
            self._dropped_bytes += gone


class HandlerAPI(ABC, Generic[TResource]):
    """The interface between the executor and a handler (register with `@provider`)."""

    def __init__(self, agent: Any, io: object = None) -> None:
        self._agent = agent
        self._client = None
        self._ioloop = getattr(agent, "eventloop", None)

    def close(self) -> None:
        """Called when the handler instance is no longer used."""

    def deploy(
        self,
        ctx: HandlerContext,
        resource: TResource,
        requires: abc.Mapping[ResourceIdStr, ResourceState],
    ) -> None:
        """Run `execute`, then `do_reload` when the handler can reload and a requirement
        changed. Steward's scheduler only deploys a resource once its requirements are
        deployed (it skips it otherwise), so `requires` are all deployed here."""
        unexpected = {
            rid: state
            for rid, state in requires.items()
            if state in (ResourceState.available, ResourceState.dry, ResourceState.undefined,
                         ResourceState.skipped_for_undefined, ResourceState.deploying)
        }
        if unexpected:
            ctx.set_status(ResourceState.skipped)
            ctx.warning(
                "Resource %(resource)s skipped because a dependency is in an unexpected state: %(unexpected_states)s",
                resource=resource.id.resource_version_str(),
                unexpected_states=str({rid: state.value for rid, state in unexpected.items()}),
            )
            return
        failed = [req for req, status in requires.items() if status != ResourceState.deployed]
        if failed:
            ctx.set_status(ResourceState.skipped)
            ctx.info(
                "Resource %(resource)s skipped due to failed dependencies: %(failed)s",
                resource=resource.id.resource_version_str(),
                failed=str(failed),
            )
            return
        self.execute(ctx, resource)
        if self.can_reload() and getattr(self._agent, "reload_requested", False):
            ctx.info("Reloading %(resource_id)s because a requirement changed", resource_id=resource.id)
            self.do_reload(ctx, resource)

    @abstractmethod
    def execute(self, ctx: HandlerContext, resource: TResource, dry_run: bool = False) -> None:
        """Enforce the intent (or, in a dry-run, only compute the changes)."""

    @abstractmethod
    def check_facts(self, ctx: HandlerContext, resource: TResource) -> dict[str, object]:
        raise NotImplementedError()

    def set_cache(self, cache: AgentCache) -> None:
        self.cache = cache

    def can_reload(self) -> bool:
        return False

    def do_reload(self, ctx: HandlerContext, resource: TResource) -> None:
        """Reload the resource (a requirement changed)."""

    def pre(self, ctx: HandlerContext, resource: TResource) -> None:
        """Runs before every operation (deploy, dry-run, facts)."""

    def post(self, ctx: HandlerContext, resource: TResource) -> None:
        """Runs after every operation, also when it failed."""

    def facts(self, ctx: HandlerContext, resource: TResource) -> dict[str, object]:
        return {}

    def run_sync(self, func: Callable[[], Any]) -> Any:
        """Run a coroutine function to completion (there is no agent event loop here)."""
        import asyncio

        result = func()
        if inspect.isawaitable(result):
            return asyncio.run(_await(result))
        return result

    def get_client(self) -> Any:
        """A client scoped to this agent's environment (see `inmanta.protocol`): the
        environment's parameters and the facts of the agent's resources."""
        from inmanta import protocol

        if getattr(self, "_client", None) is None:
            self._client = protocol.SessionClient("agent", self._agent.sessionid)
        return self._client

    def get_file(self, hash_id: str) -> Optional[bytes]:
        """The content of a file the export uploaded (by its sha1), or None."""
        return self._agent.get_file(hash_id)

    def stat_file(self, hash_id: str) -> bool:
        return self.get_file(hash_id) is not None

    def upload_file(self, hash_id: str, content: bytes) -> None:
        self._agent.upload_file(hash_id, content)


async def _await(a: Any) -> Any:
    return await a


class ResourceHandler(HandlerAPI[TResource]):
    """A handler that checks the resource (`check_resource`) and applies changes (`do_changes`)."""

    def _diff(self, current: TResource, desired: TResource) -> dict[str, dict[str, typing.Any]]:
        changes = {}
        for field in current.__class__.fields:
            current_value = getattr(current, field)
            desired_value = getattr(desired, field)
            if current_value != desired_value and desired_value is not None:
                changes[field] = {"current": current_value, "desired": desired_value}
        return changes

    def check_resource(self, ctx: HandlerContext, resource: TResource) -> TResource:
        raise NotImplementedError()

    def list_changes(self, ctx: HandlerContext, resource: TResource) -> dict[str, dict[str, typing.Any]]:
        current = self.check_resource(ctx, resource)
        return self._diff(current, resource)

    def do_changes(self, ctx: HandlerContext, resource: TResource, changes: abc.Mapping[str, abc.Mapping[str, object]]) -> None:
        raise NotImplementedError()

    def execute(self, ctx: HandlerContext, resource: TResource, dry_run: bool = False) -> None:
        try:
            self.pre(ctx, resource)
            changes = self.list_changes(ctx, resource)
            ctx.update_changes(changes)
            if not dry_run:
                self.do_changes(ctx, resource, changes)
                ctx.set_status(ResourceState.deployed)
            else:
                ctx.set_status(ResourceState.dry)
        except SkipResource as e:
            ctx.set_status(ResourceState.skipped)
            ctx.warning(msg="Resource %(resource_id)s was skipped: %(reason)s", resource_id=resource.id, reason=e.args)
        except Exception as e:
            ctx.set_status(ResourceState.failed)
            ctx.exception(
                "An error occurred during deployment of %(resource_id)s (exception: %(exception)s)",
                resource_id=resource.id,
                exception=f"{e.__class__.__name__}('{e}')",
            )
        finally:
            try:
                self.post(ctx, resource)
            except Exception as e:
                ctx.exception(
                    "An error occurred after deployment of %(resource_id)s (exception: %(exception)s)",
                    resource_id=resource.id,
                    exception=f"{e.__class__.__name__}('{e}')",
                )

    def check_facts(self, ctx: HandlerContext, resource: TResource) -> dict[str, object]:
        facts: dict[str, object] = {}
        try:
            self.pre(ctx, resource)
            facts = self.facts(ctx, resource)
        finally:
            try:
                self.post(ctx, resource)
            except Exception as e:
                ctx.exception(
                    "An error occurred after getting facts about %(resource_id)s (exception: %(exception)s)",
                    resource_id=resource.id,
                    exception=f"{e.__class__.__name__}('{e}')",
                )
        return facts


class CRUDHandler(ResourceHandler[TPurgeableResource]):
    """A handler with create, read, update and delete methods (for purgeable resources)."""

    def read_resource(self, ctx: HandlerContext, resource: TPurgeableResource) -> None:
        """Make `resource` (a clone of the desired state with purged=False) describe reality;
        raise `ResourcePurged` when it does not exist."""

    def create_resource(self, ctx: HandlerContext, resource: TPurgeableResource) -> None:
        """Create the resource (call `ctx.set_created()`)."""

    def delete_resource(self, ctx: HandlerContext, resource: TPurgeableResource) -> None:
        """Delete the resource (call `ctx.set_purged()`)."""

    def update_resource(self, ctx: HandlerContext, changes: dict[str, dict[str, Any]], resource: TPurgeableResource) -> None:
        """Apply `changes` ({field: {"current", "desired"}}) (call `ctx.set_updated()`)."""

    def calculate_diff(
        self, ctx: HandlerContext, current: TPurgeableResource, desired: TPurgeableResource
    ) -> dict[str, dict[str, typing.Any]]:
        return self._diff(current, desired)

    def execute(self, ctx: HandlerContext, resource: TPurgeableResource, dry_run: bool = False) -> None:
        try:
            self.pre(ctx, resource)
            desired = resource
            current: TPurgeableResource = desired.clone(purged=False)
            changes: dict[str, dict[str, typing.Any]] = {}
            try:
                ctx.debug("Calling read_resource")
                self.read_resource(ctx, current)
                changes = self.calculate_diff(ctx, current, desired)
            except ResourcePurged:
                if not desired.purged:
                    changes["purged"] = dict(desired=desired.purged, current=True)

            for field, values in changes.items():
                ctx.add_change(field, desired=values["desired"], current=values["current"])

            if not dry_run:
                if "purged" in changes:
                    if not changes["purged"]["desired"]:
                        ctx.debug("Calling create_resource")
                        self.create_resource(ctx, desired)
                    else:
                        ctx.debug("Calling delete_resource")
                        self.delete_resource(ctx, desired)
                elif not desired.purged and len(changes) > 0:
                    ctx.debug("Calling update_resource", changes=changes)
                    self.update_resource(ctx, dict(changes), desired)
                ctx.set_status(ResourceState.deployed)
            else:
                ctx.set_status(ResourceState.dry)
        except SkipResource as e:
            ctx.set_status(ResourceState.skipped)
            ctx.warning(msg="Resource %(resource_id)s was skipped: %(reason)s", resource_id=resource.id, reason=e.args)
        except Exception as e:
            ctx.set_status(ResourceState.failed)
            ctx.exception(
                "An error occurred during deployment of %(resource_id)s (exception: %(exception)s)",
                resource_id=resource.id,
                exception=f"{e.__class__.__name__}('{e}')",
                traceback=traceback.format_exc(),
            )
        finally:
            try:
                self.post(ctx, resource)
            except Exception as e:
                ctx.exception(
                    "An error occurred after deployment of %(resource_id)s (exception: %(exception)s)",
                    resource_id=resource.id,
                    exception=f"{e.__class__.__name__}('{e}')",
                )


CRUDHandlerGeneric = CRUDHandler

TDiscovery = TypeVar("TDiscovery", bound=resources.DiscoveryResource)
TDiscovered = TypeVar("TDiscovered")


class DiscoveryHandler(HandlerAPI[TDiscovery], Generic[TDiscovery, TDiscovered]):
    """The handler of a discovery resource, which finds unmanaged resources and reports them
    to the Inmanta server. Steward keeps no discovered resources: a module defining one
    imports and its other handlers work, and deploying a discovery resource fails, saying
    so."""

    def check_facts(self, ctx: HandlerContext, resource: TDiscovery) -> dict[str, object]:
        return {}

    def discover_resources(self, ctx: HandlerContext, discovery_resource: TDiscovery) -> abc.Mapping[ResourceIdStr, TDiscovered]:
        raise NotImplementedError()

    def execute(self, ctx: HandlerContext, resource: TDiscovery, dry_run: bool = False) -> None:
        raise HandlerNotAvailableException(
            f"{resource.id.get_entity_type()} is a discovery resource: Steward does not keep discovered resources"
        )


class Commander:
    """The registry of handler classes by resource type."""

    __command_functions: dict[str, type[ResourceHandler[Any]]] = {}

    @classmethod
    def get_handlers(cls) -> dict[str, type[ResourceHandler[Any]]]:
        return cls.__command_functions

    @classmethod
    def reset(cls) -> None:
        cls.__command_functions = {}

    @classmethod
    def close(cls) -> None:
        pass

    @classmethod
    def get_provider(cls, agent: Any, resource: resources.Resource) -> HandlerAPI[Any]:
        resource_type = resource.id.get_entity_type()
        if resource_type not in cls.__command_functions:
            raise Exception("No resource handler registered for resource of type %s" % resource_type)
        return cls.__command_functions[resource_type](agent)

    @classmethod
    def add_provider(cls, resource: str, provider: type[ResourceHandler[Any]]) -> None:
        cls.__command_functions[resource] = provider

    @classmethod
    def get_providers(cls) -> typing.Iterator[tuple[str, type[ResourceHandler[Any]]]]:
        yield from cls.__command_functions.items()

    @classmethod
    def get_provider_class(cls, resource_type: str, name: str) -> Optional[type[ResourceHandler[Any]]]:
        return cls.__command_functions.get(resource_type, None)


def hash_file(content: bytes) -> str:
    """sha1 of a file's content, hex: how Inmanta names uploaded files."""
    return hashlib.sha1(content).hexdigest()


__all__ = [
    "provider", "SkipResource", "ResourcePurged", "ResourceNotFoundException", "InvalidOperation",
    "HandlerNotAvailableException", "cache", "LoggerABC", "PythonLogger", "HandlerContext", "HandlerAPI",
    "ResourceHandler", "CRUDHandler", "CRUDHandlerGeneric", "DiscoveryHandler", "Commander",
]
