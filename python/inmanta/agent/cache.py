"""The handler cache (`AgentCache`), as inmanta-core 14 has it, plus version-bound entries.

An entry lives until it is stale: `evict_after_last_access` seconds after its last use and/or
`evict_after_creation` seconds after it entered the cache. `@cache(for_version=True)` entries
(the documented legacy behaviour) are moreover bound to the model version of the action that
made them: the key holds that version, and they are dropped when Steward reports that the
version's deploy is done (`close_version`). `call_on_delete` runs exactly once per entry,
whenever it goes (stale, version done, host shutting down).
"""

import logging
import sys
import time
from threading import Lock
from types import TracebackType
from typing import Any, Callable, Optional

LOGGER = logging.getLogger(__name__)


class CacheItem:
    def __init__(
        self,
        key: str,
        value: Any,
        call_on_delete: Optional[Callable[[Any], None]],
        evict_after_last_access: float,
        evict_after_creation: float,
        version: Optional[int] = None,
    ) -> None:
        self.key = key
        self.value = value
        self.call_on_delete = call_on_delete
        self.refresh_after_access = evict_after_last_access
        self.version = version
        now = time.time()
        self.expiry_time: float = sys.float_info.max
        self.after_creation_expiry_time: float = sys.float_info.max
        if evict_after_last_access > 0:
            self.expiry_time = now + evict_after_last_access
        if evict_after_creation > 0:
            self.after_creation_expiry_time = now + evict_after_creation
            self.expiry_time = min(self.expiry_time, self.after_creation_expiry_time)
        self.finalizer_lock = Lock()
        self.called_finalizer = False

    def __lt__(self, other: "CacheItem") -> bool:
        return self.expiry_time < other.expiry_time

    def delete(self) -> None:
        with self.finalizer_lock:
            if callable(self.call_on_delete) and not self.called_finalizer:
                self.called_finalizer = True
                try:
                    self.call_on_delete(self.value)
                except Exception:
                    LOGGER.exception("call_on_delete of cache entry %s failed", self.key)

    def refresh(self, now: float) -> None:
        if self.refresh_after_access <= 0:
            return
        self.expiry_time = min(now + self.refresh_after_access, self.after_creation_expiry_time)


def _retention(
    for_version: Optional[bool], timeout: Optional[int], evict_after_last_access: float, evict_after_creation: float
) -> tuple[float, float]:
    """(evict_after_last_access, evict_after_creation) from old- and new-style parameters, as core 14 computes them."""
    if for_version is not None:
        if for_version:
            return (evict_after_last_access if evict_after_last_access > 0 else 60.0, 0.0)
        if evict_after_creation > 0:
            return (0.0, evict_after_creation)
        if timeout and timeout > 0:
            return (0.0, float(timeout))
        return (0.0, 5000.0)
    if evict_after_creation <= 0 and evict_after_last_access <= 0:
        if timeout and timeout > 0:
            return (0.0, float(timeout))
        return (60.0, 0.0)
    return (evict_after_last_access, evict_after_creation)


class AgentCache:
    def __init__(self, agent_instance: object = None) -> None:
        self.cache: dict[str, CacheItem] = {}
        self.used_items_to_refresh: set[CacheItem] = set()
        self.addLock = Lock()
        self.addLocks: dict[str, Lock] = {}
        # the model version of the action running now (set by the handler host)
        self.version: Optional[int] = None

    def close(self) -> None:
        """Drop everything (the host is going away)."""
        items = list(self.cache.values())
        self.cache.clear()
        self.used_items_to_refresh.clear()
        for item in items:
            item.delete()

    def open_version(self, version: int) -> None:
        self.version = version

    def close_version(self, version: int) -> int:
        """The deploy of `version` is done: drop the entries bound to it. Returns how many went."""
        gone = [item for item in self.cache.values() if item.version == version]
        for item in gone:
            self._remove(item)
        return len(gone)

    def _remove(self, item: CacheItem) -> None:
        self.cache.pop(item.key, None)
        self.used_items_to_refresh.discard(item)
        item.delete()

    def clean_stale_entries(self) -> None:
        now = time.time()
        for item in [i for i in self.cache.values() if i.expiry_time < now]:
            self._remove(item)

    def touch_used_cache_items(self) -> None:
        now = time.time()
        for item in self.used_items_to_refresh:
            item.refresh(now)
        self.used_items_to_refresh = set()

    def __enter__(self) -> None:
        self.clean_stale_entries()

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc_val: Optional[BaseException],
        exc_tb: Optional[TracebackType],
    ) -> None:
        self.touch_used_cache_items()

    def _get(self, key: str) -> CacheItem:
        item = self.cache[key]
        if item.expiry_time < time.time():
            self._remove(item)
            raise KeyError(key)
        if item.refresh_after_access:
            self.used_items_to_refresh.add(item)
        return item

    def _get_key(self, key: str, resource: Any, version: Optional[int] = None) -> str:
        parts = [key]
        if resource is not None:
            parts.append(str(resource.id.resource_str()))
        if version is not None:
            parts.append(f"v={version}")
        return "__".join(parts)

    def cache_value(
        self,
        key: str,
        value: Any,
        evict_after_last_access: float = 60,
        evict_after_creation: float = 0,
        resource: Any = None,
        call_on_delete: Optional[Callable[[Any], None]] = None,
        version: Optional[int] = None,
    ) -> None:
        full = self._get_key(key, resource, version)
        if full in self.cache:
            raise Exception("Added same item twice")
        item = CacheItem(full, value, call_on_delete, evict_after_last_access, evict_after_creation, version)
        self.cache[full] = item
        if item.refresh_after_access:
            self.used_items_to_refresh.add(item)

    def find(self, key: str, resource: Any = None, version: Optional[int] = None) -> Any:
        """The cached value; KeyError when there is none (or it is stale)."""
        return self._get(self._get_key(key, resource, version)).value

    def get_or_else(
        self,
        key: str,
        function: Callable[..., Any],
        for_version: Optional[bool] = None,
        timeout: Optional[int] = None,
        evict_after_last_access: float = 60.0,
        evict_after_creation: float = 0.0,
        ignore: set[str] = set(),
        cache_none: bool = True,
        call_on_delete: Optional[Callable[[Any], None]] = None,
        **kwargs: Any,
    ) -> Any:
        """The cached value of `key` and the arguments (a `resource` argument by its id), or
        `function(**kwargs)`, cached."""
        return self._get_or_else(
            key, function, for_version, timeout, evict_after_last_access, evict_after_creation,
            ignore, cache_none, call_on_delete, kwargs,
        )

    def _get_or_else(
        self,
        key: str,
        function: Callable[..., Any],
        for_version: Optional[bool],
        timeout: Optional[int],
        evict_after_last_access: float,
        evict_after_creation: float,
        ignore: set[str],
        cache_none: bool,
        call_on_delete: Optional[Callable[[Any], None]],
        kwargs: dict[str, Any],
    ) -> Any:
        # the arguments as a dict: a cached method may have one named `key` or `function`
        acceptable = {"resource"}
        args: dict[str, Any] = {k: v for k, v in kwargs.items() if k in acceptable and k not in ignore}
        if for_version:
            args["version"] = self.version
        for k in sorted(k for k in kwargs if k not in acceptable and k not in ignore):
            key = f"{k},{repr(kwargs[k])}" + key
        try:
            return self.find(key, **args)
        except KeyError:
            with self.addLock:
                lock = self.addLocks.setdefault(key, Lock())
            with lock:
                try:
                    value = self.find(key, **args)
                except KeyError:
                    value = function(**kwargs)
                    if cache_none or value is not None:
                        last_access, creation = _retention(for_version, timeout, evict_after_last_access, evict_after_creation)
                        self.cache_value(
                            key=key,
                            value=value,
                            call_on_delete=call_on_delete,
                            evict_after_last_access=last_access,
                            evict_after_creation=creation,
                            **args,
                        )
            with self.addLock:
                self.addLocks.pop(key, None)
            return value
