"""Exporter hooks modules register: `@dependency_manager` and `@export`.

    @dependency_manager
    def dir_before_file(model: dict[str, list[DynamicProxy]], resources: dict[Id, Resource]) -> None:
        ...

Steward's plugin host runs every registered dependency manager at export with the model's
instances by type and the resources built from `@resource` classes (both as Inmanta passes
them); changes to `resource.requires` are exported.
"""

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from inmanta.resources import Id, Resource

# Parameters whose value was unknown at export (std's `environment_server`, … append to it):
# kept for modules that report them, not sent anywhere.
unknown_parameters: list[dict[str, str]] = []

# The shapes dependency managers receive: instances by entity type, resources by id.
ModelDict = dict[str, Any]
ResourceDict = dict["Id", "Resource"]


class DependencyManager:
    __dep_manager: list[Callable[..., Any]] = []

    @classmethod
    def register(cls, fn: Callable[..., Any]) -> None:
        cls.__dep_manager.append(fn)

    @classmethod
    def get_dependency_managers(cls) -> list[Callable[..., Any]]:
        return list(cls.__dep_manager)


def dependency_manager(function: Callable[..., Any]) -> Callable[..., Any]:
    """Register a function that manages dependencies between resources at export."""
    DependencyManager.register(function)
    return function


class export:  # noqa: N801
    """Register an exporter function for the given entity types (kept, not run by Steward)."""

    __export_functions: dict[str, tuple[list[str], Callable[..., Any]]] = {}

    def __init__(self, name: str, *types: str) -> None:
        self.name = name
        self.types = list(types)

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        export.__export_functions[self.name] = (self.types, function)
        return function

    @classmethod
    def get_functions(cls) -> dict[str, tuple[list[str], Callable[..., Any]]]:
        return dict(cls.__export_functions)


class Exporter:
    """Passed to `get_<field>` mappers at export, as Inmanta passes its exporter.

    `upload_file` keeps a file's content under its SHA-1 (what the real `fs` module's `get_hash`
    calls): Steward ships the files uploaded during an export with the version's handler code,
    where `HandlerAPI.get_file(hash)` finds them.
    """

    def __init__(self) -> None:
        self._files: dict[str, bytes] = {}

    def upload_file(self, content: "str | bytes") -> str:
        import hashlib

        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        hash_id = hashlib.sha1(data).hexdigest()
        self._files[hash_id] = data
        return hash_id

    def get_files(self) -> dict[str, bytes]:
        return dict(self._files)
