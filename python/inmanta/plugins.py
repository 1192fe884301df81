"""Plugins: Python functions the model calls (`@plugin`), as inmanta-core 14 has them.

    from inmanta.plugins import plugin, Context

    @plugin
    def greet(ctx: Context, host: "std::Host", greeting: "string" = "hello") -> "string":
        return f"{greeting} {host.name}"

In Steward the compiler (Rust) binds and type-checks the arguments of a call from the
signature it reads in the module's source; Steward's plugin host (`steward_plugin_host`)
calls the function with entity instances as read-only proxies (`inmanta.execute.proxy`).
"""

import os
from collections.abc import Callable
from typing import Any, Optional, TypeVar

from inmanta.ast import Namespace, RuntimeException
from inmanta.execute.proxy import DynamicProxy, EntityType
from inmanta.execute.util import NoneValue, Unknown

T = TypeVar("T")

PLUGINS_PACKAGE = "inmanta_plugins"


class PluginException(Exception):
    """Base class for exceptions a plugin raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PluginDeprecationWarning(Warning):
    pass


class ModelType:
    """`Annotated[..., ModelType["std::Entity"]]`: the model type of a Python annotation."""

    def __class_getitem__(cls, item: str) -> "ModelType":
        inst = object.__new__(cls)
        inst.model_type = item  # type: ignore[attr-defined]
        return inst


class Compiler:
    """What `Context.get_compiler()` returns: the plugins, the project, data."""

    def __init__(self, host: Any) -> None:
        self._host = host

    def get_plugins(self) -> dict[str, "Plugin"]:
        """Every plugin by its full name, as callable `Plugin` instances (inmanta-core's
        compiler holds instances: modules call them, e.g. the config module registers each as a
        Jinja filter and inserts the `Context` at `_context`)."""
        return {name: cls.instance() for name, cls in PluginMeta.get_functions().items()}

    def get_project(self) -> Any:
        from inmanta.module import Project

        return Project.get()

    def get_types(self) -> dict[str, EntityType]:
        return dict(self._host.types)


class Context:
    """What a plugin gets when one of its parameters is annotated `Context`."""

    def __init__(self, host: Any, plugin: "type[Plugin]", owner: Any = None) -> None:
        self._host = host
        self.plugin = plugin
        self.owner = owner
        self.compiler = Compiler(host)

    def get_resolver(self) -> Any:
        return self._host

    def get_type(self, name: str) -> EntityType:
        t = self._host.types.get(str(name))
        if t is None:
            from inmanta.ast import NotFoundException

            raise NotFoundException(None, str(name), f"could not find type {name}")
        return t

    def get_queue_scheduler(self) -> Any:
        return self._host

    def get_environment_id(self) -> str:
        env = self._host.environment
        if env is None:
            raise Exception("The environment of the model should be configured in config>environment")
        return env

    def get_compiler(self) -> Compiler:
        return self.compiler

    def get_data_dir(self) -> str:
        """`data/<plugin namespace>` in the project directory, created if needed."""
        data_dir = os.path.join(self._host.project_dir, "data", self.plugin.ns.get_full_name())
        os.makedirs(data_dir, exist_ok=True)
        return data_dir

    def get_client(self) -> Any:
        raise Exception("Steward's compiler has no Inmanta API client: plugins can not call the server")

    def get_sync_client(self) -> Any:
        return self.get_client()

    def run_sync(self, function: Callable[[], Any], timeout: int = 5) -> Any:
        import asyncio

        return asyncio.run(asyncio.wait_for(function(), timeout))


class PluginMeta(type):
    """Registers every plugin class by its full name (`ns::name`)."""

    __functions: dict[str, "type[Plugin]"] = {}

    def __new__(cls, name, bases, dct):  # type: ignore[no-untyped-def]
        subclass = type.__new__(cls, name, bases, dct)
        if "__function_name__" in dct:
            cls.add_function(subclass)
        return subclass

    @classmethod
    def add_function(cls, plugin_class: "type[Plugin]") -> None:
        cls.__functions[plugin_class.__fq_plugin_name__] = plugin_class

    @classmethod
    def get_functions(cls) -> dict[str, "type[Plugin]"]:
        return cls.__functions

    @classmethod
    def clear(cls, inmanta_module: Optional[str] = None) -> None:
        if inmanta_module is None:
            cls.__functions = {}
        else:
            prefix = f"{inmanta_module}::"
            cls.__functions = {k: v for k, v in cls.__functions.items() if not k.startswith(prefix) and k != inmanta_module}


class Plugin(metaclass=PluginMeta):
    """A plugin, one class per `@plugin` function (the class is what the registry holds; the
    plugin host calls the function through it). `Compiler.get_plugins()` hands out one instance
    per class, which is what inmanta-core's plugins are: callable, with `ns`, `_context`."""

    deprecated: bool = False
    replaced_by: Optional[str] = None
    opts: dict[str, Any] = {}
    __function_name__: str
    __fq_plugin_name__: str
    __function__: Callable[..., Any]

    def __init__(self, namespace: Optional[Namespace] = None) -> None:
        self.ns = namespace if namespace is not None else type(self).ns  # type: ignore[attr-defined]
        self.namespace = self.ns
        # the position of the Context parameter, -1 without one: callers insert their context there
        position = type(self).context_position()
        self._context: int = -1 if position is None else position

    @classmethod
    def instance(cls) -> "Plugin":
        """The one instance of this plugin (made on first use)."""
        made = cls.__dict__.get("_instance")
        if made is None:
            made = cls()
            cls._instance = made  # type: ignore[attr-defined]
        return made

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function as inmanta-core's `Plugin.__call__` does: arguments wrapped as the
        model's proxies (a Context as it is, an unknown as it is when the plugin accepts
        unknowns), the result unwrapped."""
        if self.deprecated:
            import warnings

            msg = f"Plugin '{self.get_full_name()}' is deprecated."
            if self.replaced_by:
                msg += f" It should be replaced by '{self.replaced_by}'."
            warnings.warn(PluginDeprecationWarning(msg))

        def wrap(value: Any) -> Any:
            if isinstance(value, Context) or (isinstance(value, Unknown) and self.is_accept_unknowns()):
                return value
            return DynamicProxy.return_value(value)

        result = type(self).__function__(*[wrap(a) for a in args], **{k: wrap(v) for k, v in kwargs.items()})
        return DynamicProxy.unwrap(result)

    @classmethod
    def get_full_name(cls) -> str:
        return cls.__fq_plugin_name__

    @classmethod
    def context_position(cls) -> Optional[int]:
        """The position of the `Context` parameter, if the function has one."""
        import inspect

        sig = inspect.signature(cls.__function__)
        for i, p in enumerate(sig.parameters.values()):
            ann = p.annotation
            if ann is Context or (isinstance(ann, str) and ann in ("Context", "plugins.Context", "inmanta.plugins.Context")):
                return i
        return None

    @classmethod
    def is_accept_unknowns(cls) -> bool:
        return bool(cls.opts.get("allow_unknown", False))

    @classmethod
    def deprecate_function(cls, replaced_by: Optional[str] = None) -> None:
        cls.deprecated = True
        cls.replaced_by = replaced_by

    def __str__(self) -> str:
        return self.get_full_name()


def plugin(
    function: Optional[Callable] = None,
    commands: Optional[list[str]] = None,
    emits_statements: bool = False,
    allow_unknown: bool = False,
) -> Callable:
    """Register a function as a plugin: `@plugin`, `@plugin("name")`, `@plugin(allow_unknown=True)`."""

    def curry_name(name: Optional[str] = None) -> Callable:
        def call(fnc: Callable) -> Callable:
            nonlocal name
            if name is None:
                name = fnc.__name__
            ns_parts = str(fnc.__module__).split(".")
            if ns_parts[0] != PLUGINS_PACKAGE:
                raise Exception("All plugin modules should be loaded in the %s package" % PLUGINS_PACKAGE)
            namespace = "::".join(ns_parts[1:])
            dictionary = {
                "__module__": fnc.__module__,
                "__function_name__": name,
                "__fq_plugin_name__": f"{namespace}::{name}",
                "opts": {"bin": commands, "emits_statements": emits_statements, "allow_unknown": allow_unknown},
                "__function__": staticmethod(fnc),
                "ns": Namespace(namespace),
            }
            fnc.__plugin__ = PluginMeta(name, (Plugin,), dictionary)  # type: ignore[attr-defined]
            return fnc

        return call

    if function is None:
        return curry_name()
    if isinstance(function, str):
        return curry_name(function)
    return curry_name()(function)


def deprecated(function: Optional[Callable] = None, *, replaced_by: Optional[str] = None, **kwargs: Any) -> Callable:
    """Mark a plugin deprecated (placed above `@plugin`)."""

    def inner(fnc: Callable) -> Callable:
        if hasattr(fnc, "__plugin__"):
            fnc.__plugin__.deprecate_function(replaced_by)
        else:
            raise Exception(
                f"Can not deprecate '{fnc.__name__}': The '@deprecated' decorator should be used in combination with the "
                f"'@plugin' decorator and should be placed at the top."
            )
        return fnc

    if function is not None:
        return inner(function)
    return inner


__all__ = [
    "Context",
    "DynamicProxy",
    "ModelType",
    "NoneValue",
    "Plugin",
    "PluginException",
    "PluginMeta",
    "RuntimeException",
    "Unknown",
    "deprecated",
    "plugin",
]
