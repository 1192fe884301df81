"""Constants of inmanta-core 14 that module code uses (states, changes, actions, log levels)."""

from collections import abc
from enum import Enum
from typing import Optional


class ResourceState(str, Enum):
    unavailable = "unavailable"  # no handler is available for the resource
    skipped = "skipped"
    dry = "dry"
    deployed = "deployed"
    failed = "failed"
    deploying = "deploying"
    available = "available"
    cancelled = "cancelled"
    undefined = "undefined"
    skipped_for_undefined = "skipped_for_undefined"


class NonDeployingResourceState(str, Enum):
    unavailable = ResourceState.unavailable.value
    skipped = ResourceState.skipped.value
    dry = ResourceState.dry.value
    deployed = ResourceState.deployed.value
    failed = ResourceState.failed.value
    available = ResourceState.available.value
    cancelled = ResourceState.cancelled.value
    undefined = ResourceState.undefined.value
    skipped_for_undefined = ResourceState.skipped_for_undefined.value


UNDEPLOYABLE_STATES = [ResourceState.undefined, ResourceState.skipped_for_undefined]
UNDEPLOYABLE_NAMES = [s.name for s in UNDEPLOYABLE_STATES]
TRANSIENT_STATES = [ResourceState.available, ResourceState.deploying]
NOT_DONE_STATES = TRANSIENT_STATES
DONE_STATES = [
    ResourceState.unavailable,
    ResourceState.skipped,
    ResourceState.deployed,
    ResourceState.failed,
    ResourceState.cancelled,
] + UNDEPLOYABLE_STATES
INITIAL_STATES = [ResourceState.available]
TERMINAL_STATES = UNDEPLOYABLE_STATES

UNKNOWN_STRING = "<<undefined>>"


class Change(str, Enum):
    nochange = "nochange"
    created = "created"
    purged = "purged"
    updated = "updated"


class VersionState(str, Enum):
    success = "success"
    failed = "failed"
    deploying = "deploying"
    pending = "pending"


class ResourceAction(str, Enum):
    store = "store"
    push = "push"
    pull = "pull"
    deploy = "deploy"
    dryrun = "dryrun"
    getfact = "getfact"
    other = "other"


class LogLevel(str, Enum):
    CRITICAL = "CRITICAL"
    ERROR = "ERROR"
    WARNING = "WARNING"
    INFO = "INFO"
    DEBUG = "DEBUG"
    TRACE = "TRACE"

    @property
    def to_int(self) -> int:
        return LOG_LEVEL_AS_INTEGER[self]

    @classmethod
    def _missing_(cls, value: object) -> Optional["LogLevel"]:
        return INTEGER_AS_LOG_LEVEL.get(value, None) if isinstance(value, int) else None


LOG_LEVEL_AS_INTEGER: abc.Mapping[LogLevel, int] = {
    LogLevel.CRITICAL: 50,
    LogLevel.ERROR: 40,
    LogLevel.WARNING: 30,
    LogLevel.INFO: 20,
    LogLevel.DEBUG: 10,
    LogLevel.TRACE: 3,
}
INTEGER_AS_LOG_LEVEL: abc.Mapping[int, LogLevel] = {value: level for level, value in LOG_LEVEL_AS_INTEGER.items()}
LOG_LEVEL_TRACE = 3


class ParameterSource(str, Enum):
    fact = "fact"
    plugin = "plugin"
    user = "user"
    report = "report"


class AgentStatus(str, Enum):
    paused = "paused"
    up = "up"
    down = "down"


INMANTA_URN = "urn:inmanta:"
PLUGINS_PACKAGE = "inmanta_plugins"
MODULE_PKG_NAME_PREFIX = "inmanta-module-"
TIME_ISOFMT = "%Y-%m-%dT%H:%M:%S.%f"
RESOURCE_ATTRIBUTE_SEND_EVENTS = "send_event"
RESOURCE_ATTRIBUTE_RECEIVE_EVENTS = "receive_events"
