"""Helpers of Inmanta's `std` module that other modules import (`from inmanta_plugins.std
import get_file_content`), for when `std` is Steward's built-in module. Its plugins are the
built-in ones (Rust): any other name of this module is one of them, called in the compiler
(`inmanta_plugins.std.getfact(context, resource, "name")`, `std.is_unknown(v)`)."""

from typing import Any, Optional


def _host() -> Any:
    import steward_plugin_host

    return steward_plugin_host.HOST


def determine_path(ctx: Any, module_dir: str, path: str) -> Optional[str]:
    """The file `path` (`<module>/<name>`, or `/<name>` in the project) under `module_dir`
    (`files`, `templates`) of its module; None when the module does not exist."""
    return _host().module_file_path(module_dir, path)


def get_file_content(ctx: Any, module_dir: str, path: str) -> str:
    """The content of a module's file (`<module>/<name>` under `files` or `templates`)."""
    return _host().module_file(module_dir, path)


class FileMarker(str):
    """A string that stands for a file of a module."""

    def __new__(cls, filename: str) -> "FileMarker":
        obj = str.__new__(cls, "imp-module-source:file://" + filename)
        obj.filename = filename  # type: ignore[attr-defined]
        return obj


def getfact(context: Any, resource: Any, fact_name: str, default_value: Any = None) -> Any:
    """A fact of a resource from the environment (the built-in `std::getfact`)."""
    return _host().getfact(resource, fact_name, default_value)


def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)

    def builtin_plugin(*args: Any, **kwargs: Any) -> Any:
        from inmanta.plugins import Context

        # the reference's plugin functions take the Context first when they declare one
        if args and isinstance(args[0], Context):
            args = args[1:]
        return _host().builtin("std::" + name, list(args), kwargs)

    builtin_plugin.__name__ = name
    builtin_plugin.__qualname__ = name
    return builtin_plugin
