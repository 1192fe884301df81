"""Exporter hooks modules register: `@dependency_manager` and `@export`.

    @dependency_manager
    def dir_before_file(model: dict[str, list[DynamicProxy]], resources: dict[Id, Resource]) -> None:
        ...

Steward's plugin host runs every registered dependency manager at export with the model's
instances by type and the resources built from `@resource` classes (both as Inmanta passes
them); changes to `resource.requires` are exported.
"""

from typing import Any, Callable


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
    """Passed (as None in Inmanta's own mappers) to `get_<field>` mappers."""
