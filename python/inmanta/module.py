"""The module/project surface that some modules reach for (`Project.get().modules[...]`)."""

import os
from typing import Any, Optional


class Module:
    """A module of the compile: its name, version and directory."""

    def __init__(self, name: str, path: str, version: str = "0.0.0") -> None:
        self.name = name
        self._path = path
        self.version = version

    def get_name(self) -> str:
        return self.name

    @property
    def path(self) -> str:
        return self._path

    def get_plugin_files(self) -> list[tuple[str, str]]:
        out = []
        for root, _dirs, files in os.walk(self._path):
            for f in files:
                if f.endswith(".py"):
                    full = os.path.join(root, f)
                    out.append((full, os.path.relpath(full, self._path)))
        return out


class ModuleV1(Module):
    pass


class ModuleV2(Module):
    pass


class Project:
    """The project being compiled (`Project.get()`)."""

    _project: Optional["Project"] = None

    def __init__(self, path: str, modules: Optional[dict[str, Module]] = None) -> None:
        self._path = path
        self.modules: dict[str, Module] = modules or {}

    @property
    def path(self) -> str:
        return self._path

    @property
    def project_path(self) -> str:
        return self._path

    @classmethod
    def get(cls) -> "Project":
        if cls._project is None:
            raise Exception("No project is loaded")
        return cls._project

    @classmethod
    def set(cls, project: "Project") -> None:
        cls._project = project

    def get_module(self, name: str) -> Module:
        return self.modules[name]

    def load(self) -> None:
        pass


class InvalidModuleException(Exception):
    pass


def __getattr__(name: str) -> Any:
    raise AttributeError(f"inmanta.module.{name} is not part of Steward's compatibility package")
