"""Steward's plugin host: one CPython per compile that runs the Python of Inmanta modules.

The compiler (Rust) starts it on first need and talks JSON lines over stdin/stdout:

  -> {"op": "paths"}  (only before init, any number of times; answered {"ok": [directory, ...]})
  -> {"op": "init", "modules": {name: package dir}, "imports": [python module, ...],
      "deferred": {name: [python module, ...]}, "project_dir": ..., "environment": ...}
  -> {"op": "call", "plugin": "ns::name", "module": "inmanta_plugins.ns", "kwargs": {...}, "varargs": [...]}
  -> {"op": "load"}  (import the deferred modules now)
  -> {"op": "export", "items": [entity, ...]}
  <- {"ok": value} | {"unset": [handle, attribute]} | {"unknown": true} | {"error": {...}}
     | {"error": {...}, "load": true}  (a module's Python failed to import: so does every later request)

`imports` are imported at init. A `deferred` module's Python is imported only when something
needs it: a Python import of its package (another module's code, a call of one of its plugins),
a read of a registry it would fill (plugins, resource classes, dependency managers) or an
export. Only modules whose import has no effect but those registrations are deferred (the real
std: its jinja2 and pydantic imports are most of the host's start, and Steward runs its
plugins built in).

While a call runs the host may ask the compiler ({"q": "attr", "h": handle, "a": name},
{"q": "file", "dir": ..., "path": ...}) and reads its answer ({"v": value}, {"unset": true},
{"missing": message}, {"err": message}) before going on.

Values: JSON, with {"$e": handle, "t": type, "p": [parents], "f": [fields], "a": {attributes}} for
an entity instance (type, parents and attribute schema the first time a type is sent, attributes
when known), {"$u": 1} for an unknown and
{"$d": {...}} for a dict whose keys could be mistaken for these.
"""

from __future__ import annotations

import os
import sys

# The compiler starts the host when it needs the interpreter's `sys.path` (to find the
# installed modules), before it knows whether a plugin will run, and waits for that answer:
# until then the host imports nothing more. These (10 ms with typing) are imported in `main`
# after it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import importlib
    import json
    from typing import Any, Optional

HOST: Optional[Host] = None

PATHS_REQUEST = '{"op":"paths"}'


FILE_MARKER_PREFIX = "imp-module-source:file://"


class FileMarker(str):
    """A string naming a file on disk, as the real `fs::file` plugin returns it.

    In Inmanta the plugin's `FileMarker` object stays in the model, and `fs::File`'s hash
    mapper reads the file when it sees the class (`"FileMarker" in cls.__name__`). Values cross
    to Steward's compiler as plain strings, so the in-band text (which the marker is, as a
    string) becomes a marker again when it comes back.
    """

    def __new__(cls, filename: str) -> "FileMarker":
        obj = str.__new__(cls, FILE_MARKER_PREFIX + filename)
        obj.filename = filename
        return obj


class Finder:
    """`inmanta_plugins.<name>` from the directory the compiler resolved for module <name>."""

    def __init__(self, host: "Host") -> None:
        self.host = host

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        parts = fullname.split(".")
        if len(parts) == 2 and parts[0] == "inmanta_plugins" and parts[1] in self.host.modules:
            d = self.host.modules[parts[1]]
            spec = importlib.util.spec_from_file_location(
                fullname, os.path.join(d, "__init__.py"), submodule_search_locations=[d]
            )
            if spec is not None and parts[1] in self.host.deferred:
                spec.loader = DeferredLoader(self.host, parts[1], spec.loader)
            return spec
        return None


class DeferredLoader:
    """Loads the package of a deferred module and then its submodules, as the reference loads a
    module (and as `init` imports the others): whoever imports the package first finds what the
    submodules register (std's resource classes live in `inmanta_plugins.std.resources`)."""

    def __init__(self, host: "Host", name: str, loader: Any) -> None:
        self.host = host
        self.name = name
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def exec_module(self, module: Any) -> None:
        python_modules = self.host.deferred.pop(self.name, [])
        # the module looks loaded as any other (`__loader__` serves `get_source`, resources)
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        try:
            try:
                self.loader.exec_module(module)
            except Exception as e:
                raise import_failure(module.__name__, e) from e
            if self.name == "std":
                route_to_builtin(module)
            for name in python_modules:
                if name != module.__name__:
                    import_checked(name)
        except Exception as e:
            # the module is broken: this request fails, and every later one, as when a
            # module's import fails at init
            if self.host.load_failure is None:
                self.host.load_failure = describe(e)
            raise


def route_to_builtin(std: Any) -> None:
    """The real std's `getfact` asks the Inmanta server through `context.get_client()`, which
    Steward's compiler has none of: it becomes the built-in plugin (which has the
    environment's facts), for other modules' Python calling `inmanta_plugins.std.getfact` and
    for the plugin registry alike. Replaced before any other module imports std, so a
    `from inmanta_plugins.std import getfact` gets this one."""
    import functools

    original = getattr(std, "getfact", None)
    if original is None:
        return

    @functools.wraps(original)
    def getfact(context: Any, resource: Any, fact_name: Any, default_value: Any = None) -> Any:
        return HOST.getfact(resource, fact_name, default_value)

    std.getfact = getfact
    plugin_class = getattr(original, "__plugin__", None)
    if plugin_class is not None:
        plugin_class.__function__ = staticmethod(getfact)


def import_failure(name: str, e: BaseException) -> ImportError:
    """The error for module code `name` failing to import with `e`: the actionable diagnostic
    when it needs a part of inmanta-core Steward lacks, else which file failed and why (the
    error alone rarely says)."""
    unsupported = unsupported_inmanta_api(e)
    if unsupported is not None:
        return UnsupportedInmantaApi(unsupported)
    # the traceback starts in the module's code, not in the host or the import machinery
    tb = e.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename == __file__
        or tb.tb_frame.f_code.co_filename.startswith("<frozen importlib")
        or tb.tb_frame.f_globals.get("__name__") == "importlib"
    ):
        tb = tb.tb_next
    if tb is not None:
        e.__traceback__ = tb
    return ImportError(f"importing {name} failed: {type(e).__name__}: {e}")


def import_checked(name: str) -> None:
    try:
        importlib.import_module(name)
    except UnsupportedInmantaApi:
        raise
    except Exception as e:
        if HOST is not None and HOST.load_failure is not None:
            # a deferred module this one imports failed: that is the error to report
            raise
        raise import_failure(name, e) from e


class Unset(Exception):
    """Internal: the compiler has no frozen value for this attribute yet."""


class Host:
    def __init__(self, inp: Any, out: Any) -> None:
        self.inp = inp
        self.out = out
        self.instances: dict[int, Any] = {}
        self.types: dict[str, Any] = {}
        self.project_dir = os.getcwd()
        self.environment: Optional[str] = None
        self.modules: dict[str, str] = {}
        # module name -> its Python modules (package first) not imported yet
        self.deferred: dict[str, list[str]] = {}
        # the report of a module whose Python failed to import (every request fails with it)
        self.load_failure: Optional[dict] = None
        # the plugin registry without loading the deferred modules (see `defer_registries`)
        self.functions: Any = None

    # --- protocol

    def send(self, msg: Any) -> None:
        self.out.write(json.dumps(msg, separators=(",", ":")))
        self.out.write("\n")
        self.out.flush()

    def ask(self, msg: Any) -> Any:
        self.send(msg)
        line = self.inp.readline()
        if not line:
            sys.exit(0)
        return json.loads(line)

    # --- values

    def decode(self, v: Any) -> Any:
        from inmanta.execute.util import NoneValue, Unknown

        if v is None:
            return NoneValue()
        if isinstance(v, list):
            return [self.decode(x) for x in v]
        if isinstance(v, dict):
            if "$e" in v:
                return self.instance(v)
            if "$u" in v:
                return Unknown(None)
            if "$d" in v:
                v = v["$d"]
            return {k: self.decode(x) for k, x in v.items()}
        if isinstance(v, str) and v.startswith(FILE_MARKER_PREFIX):
            return FileMarker(v[len(FILE_MARKER_PREFIX) :])
        return v

    def instance(self, v: dict) -> Any:
        from inmanta.execute.proxy import EntityType, Instance

        h = v["$e"]
        inst = self.instances.get(h)
        if inst is None:
            tname = v.get("t", "std::Entity")
            t = self.types.get(tname)
            if t is None:
                t = EntityType(tname, v.get("p", ()), v.get("f", ()))
                self.types[tname] = t
            inst = Instance(h, t)
            self.instances[h] = inst
        attrs = v.get("a")
        if attrs:
            for k, x in attrs.items():
                inst.attributes[k] = self.decode(x)
        return inst

    def encode(self, v: Any) -> Any:
        from inmanta.execute.proxy import DynamicProxy, Instance
        from inmanta.execute.util import NoneValue, Unknown

        if isinstance(v, DynamicProxy):
            v = v._get_instance()
        if v is None or isinstance(v, NoneValue):
            return None
        if isinstance(v, bool) or isinstance(v, (int, float, str)):
            return v
        if isinstance(v, Instance):
            return {"$e": v.handle}
        if isinstance(v, Unknown):
            return {"$u": 1}
        if isinstance(v, (list, tuple)):
            return [self.encode(x) for x in v]
        if isinstance(v, dict):
            out = {}
            escape = False
            for k, x in v.items():
                if not isinstance(k, str):
                    raise TypeError(f"dict keys should be strings, got {k!r} of type {type(k).__name__}")
                escape = escape or k.startswith("$")
                out[k] = self.encode(x)
            return {"$d": out} if escape else out
        step = getattr(v, "json_serialization_step", None)
        if step is not None:
            return self.encode(step())
        raise TypeError(f"a plugin can not return {v!r} of type {type(v).__name__} to the model")

    # --- callbacks

    def fetch(self, handle: int, attribute: str) -> Any:
        from inmanta.execute.proxy import AttributeNotFound, UnsetException

        answer = self.ask({"q": "attr", "h": handle, "a": attribute})
        if "v" in answer:
            if "i" in answer:
                self.decode(answer["i"])
            return self.decode(answer["v"])
        inst = self.instances.get(handle)
        if "unset" in answer:
            raise UnsetException(f"{attribute} of {inst} is not set yet", inst, attribute)
        if "missing" in answer:
            raise AttributeNotFound(None, attribute, answer["missing"])
        if "empty" in answer:
            # an optional relation left empty, as inmanta-core raises it
            from inmanta.ast import OptionalValueException

            raise OptionalValueException(inst, attribute)
        raise Exception(answer.get("err", "the compiler could not answer"))

    def builtin(self, plugin: str, args: list, kwargs: dict, rid: Optional[list] = None) -> Any:
        """Call one of the compiler's built-in plugins (`std::getfact`, ...); `rid`: the
        resource id of an instance among the arguments, `[handle, id]`, computed here."""
        from inmanta.execute.proxy import UnsetException
        from inmanta.plugins import PluginException

        question = {
            "q": "builtin",
            "plugin": plugin,
            "args": [self.encode(a) for a in args],
            "kwargs": {k: self.encode(v) for k, v in kwargs.items()},
        }
        if rid is not None:
            question["rid"] = rid
        answer = self.ask(question)
        if "v" in answer:
            return self.decode(answer["v"])
        if "unset" in answer:
            raise UnsetException(f"{plugin} needs a value that is not set yet")
        raise PluginException(answer.get("err", f"{plugin} failed"))

    def getfact(self, resource: Any, fact_name: Any, default_value: Any = None) -> Any:
        """`std::getfact` called from Python: the built-in plugin, which knows the
        environment's facts. The resource id of an instance of a Python `@resource` class is
        computed here, where the class and its mappers are, as the reference's `getfact`
        does first (reading what is not set yet, or unknown, raises as it does there); the
        compiler computes those of the types `module.yml` declares."""
        from inmanta.execute.proxy import DynamicProxy
        from inmanta.execute.util import Unknown
        from inmanta.resources import to_id

        rid = None
        if not isinstance(resource, Unknown):
            # a value that is no entity fails in `to_id` as in the reference
            resource_id = to_id(resource)
            if resource_id is not None and isinstance(resource, DynamicProxy):
                rid = [resource._get_instance().handle, resource_id]
        return self.builtin("std::getfact", [resource, fact_name, default_value], {}, rid)

    def module_file(self, module_dir: str, path: str) -> str:
        answer = self.ask({"q": "file", "dir": module_dir, "path": path})
        if "v" in answer:
            return answer["v"]
        raise Exception(answer.get("err", f"{path} isn't a valid file"))

    def module_file_path(self, module_dir: str, path: str) -> Optional[str]:
        answer = self.ask({"q": "path", "dir": module_dir, "path": path})
        return answer.get("v")

    # --- operations

    def op_init(self, msg: dict) -> Any:
        from inmanta import module as inmanta_module
        from inmanta.execute import proxy

        from inmanta.plugins import PluginMeta

        self.modules = msg.get("modules", {})
        self.deferred = {k: list(v) for k, v in msg.get("deferred", {}).items() if k in self.modules}
        self.project_dir = msg.get("project_dir", self.project_dir)
        self.environment = msg.get("environment")
        sys.meta_path.insert(0, Finder(self))
        proxy._fetch = self.fetch
        self.functions = PluginMeta.get_functions
        if self.deferred:
            self.defer_registries()
        mods = {}
        for name, path in self.modules.items():
            cls = inmanta_module.ModuleV2 if msg.get("v2", {}).get(name) else inmanta_module.ModuleV1
            mods[name] = cls(name, os.path.dirname(path) if not msg.get("v2", {}).get(name) else path)
        inmanta_module.Project.set(inmanta_module.Project(self.project_dir, mods))
        for name in msg.get("imports", []):
            import_checked(name)
        return None

    def defer_registries(self) -> None:
        """Reading a registry that a deferred module fills (its plugins, resource classes,
        dependency managers) loads the deferred modules first, so module code sees them as the
        reference, which imported every module at the start, shows them
        (`ctx.get_compiler().get_plugins()`, `resources.to_id`)."""
        from inmanta.export import DependencyManager
        from inmanta.plugins import PluginMeta
        from inmanta.resources import resource

        def loading_first(owner: Any, name: str) -> None:
            original = getattr(owner, name)

            def accessor(cls: Any, *args: Any, **kwargs: Any) -> Any:
                self.load_deferred()
                return original(*args, **kwargs)

            accessor.__name__ = name
            accessor.__doc__ = original.__doc__
            setattr(owner, name, classmethod(accessor))

        loading_first(PluginMeta, "get_functions")
        for name in ("get_class", "get_resources", "get_entity_resources", "validate"):
            loading_first(resource, name)
        loading_first(DependencyManager, "get_dependency_managers")

    def load_deferred(self) -> None:
        """Import the Python of every deferred module now."""
        for name in list(self.deferred):
            if name in self.deferred:  # not loaded meanwhile by one imported before it
                importlib.import_module("inmanta_plugins." + name)

    def op_load(self, msg: dict) -> Any:
        self.load_deferred()
        return None

    def op_call(self, msg: dict) -> Any:
        from inmanta.execute.proxy import DynamicProxy
        from inmanta.execute.util import NoneValue, Unknown
        from inmanta.plugins import Context, PluginMeta

        # a deferred module's plugin: importing it (through the Finder) loads that module
        plugin = self.functions().get(msg["plugin"])
        if plugin is None:
            importlib.import_module(msg["module"])
            plugin = self.functions().get(msg["plugin"])
            if plugin is None:
                raise LookupError(f"{msg['module']} registers no plugin {msg['plugin']}")
        accept_unknown = plugin.is_accept_unknowns()

        def arg(v: Any) -> Any:
            v = self.decode(v)
            if isinstance(v, Unknown) and accept_unknown:
                return v
            return DynamicProxy.return_value(v)

        kwargs = {k: arg(v) for k, v in msg.get("kwargs", {}).items()}
        ctx_name = msg.get("context")
        if ctx_name:
            kwargs[ctx_name] = Context(self, plugin, msg.get("site"))
        positional = []
        if "varargs" in msg:
            for name in msg.get("positional", []):
                positional.append(kwargs.pop(name))
            positional.extend(arg(v) for v in msg["varargs"])
        value = plugin.__function__(*positional, **kwargs)
        value = DynamicProxy.unwrap(value)
        if isinstance(value, NoneValue):
            return None
        return self.encode(value)

    def op_to_id(self, msg: dict) -> Any:
        """The resource id of an instance (`inmanta.resources.to_id`), None for one that is
        no resource of a Python class."""
        from inmanta.execute.proxy import DynamicProxy
        from inmanta.resources import to_id

        return to_id(DynamicProxy(self.decode(msg["item"])))

    def op_export(self, msg: dict) -> Any:
        from inmanta.execute.proxy import DynamicProxy, UnknownException
        from inmanta.export import DependencyManager, Exporter
        from inmanta.resources import IgnoreResourceException, Resource, resource

        # every module's resource classes and dependency managers take part (the compiler
        # asks for `load` first; this keeps the export right without it)
        self.load_deferred()
        exporter = Exporter()
        items = [self.decode(x) for x in msg.get("items", [])]
        results = []
        built: dict[Any, Any] = {}
        for inst in items:
            names = [inst.type.name] + list(inst.type.parents)
            cls_name = next((n for n in names if resource.get_class(n)[0] is not None), None)
            if cls_name is None:
                results.append({"h": inst.handle, "none": True})
                continue
            try:
                res = Resource.create_from_model(exporter, cls_name, DynamicProxy(inst))
            except IgnoreResourceException:
                results.append({"h": inst.handle, "ignored": True})
                continue
            except UnknownException:
                results.append({"h": inst.handle, "unknown": True})
                continue
            built[inst] = res
            fields = {f: self.encode(getattr(res, f)) for f in res.__class__.fields}
            results.append(
                {"h": inst.handle, "type": cls_name, "agent": res.id.agent_name, "attr": res.id.attribute,
                 "value": res.id.attribute_value, "fields": fields}
            )
        managers = DependencyManager.get_dependency_managers()
        if managers and built:
            by_inst = built
            for inst, res in by_inst.items():
                reqs = inst.get_attribute_value("requires") if "requires" in inst.attributes else []
                res.requires = {by_inst[r].id for r in (reqs or []) if r in by_inst}
                res.resource_requires = {by_inst[r] for r in (reqs or []) if r in by_inst}
            model: dict[str, list] = {}
            for inst in items:
                model.setdefault(inst.type.name, []).append(DynamicProxy(inst))
            resources = {res.id: res for res in by_inst.values()}
            for manager in managers:
                manager(model, resources)
            index = {r["h"]: r for r in results}
            for inst, res in by_inst.items():
                index[inst.handle]["requires"] = sorted(str(x) for x in res.requires)
        files = {h: data.hex() for h, data in exporter.get_files().items()}
        return {"resources": results, "files": files}


class UnsupportedInmantaApi(ImportError):
    """Module code imports a part of inmanta-core that Steward's `inmanta` package does not
    have: the message says where and what to do; no traceback (it would only lead through
    the import machinery)."""


def unsupported_inmanta_api(e: BaseException) -> Optional[str]:
    """If `e` is module code failing to import something of the `inmanta` package, the
    diagnostic for it: the module file and line, the import, and what to do."""
    import re
    import traceback

    import inmanta

    missing = None
    if isinstance(e, ImportError) and e.name and e.name.split(".")[0] == "inmanta":
        found = re.match(r"cannot import name '([^']+)'", str(e))
        missing = f"{e.name}.{found.group(1)}" if found and not isinstance(e, ModuleNotFoundError) else e.name
    elif isinstance(e, AttributeError):
        found = re.match(r"module '(inmanta(?:\.[\w.]+)?)' has no attribute '(\w+)'", str(e))
        missing = f"{found.group(1)}.{found.group(2)}" if found else None
    if missing is None:
        return None
    ours = os.path.dirname(os.path.dirname(os.path.abspath(inmanta.__file__)))
    site = None
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        name = frame.filename
        if not name.startswith("<") and not os.path.abspath(name).startswith(ours + os.sep):
            site = frame
            break
    where = f"{site.filename}:{site.lineno}: `{(site.line or '').strip()}`: " if site else ""
    module = None
    if site is not None:
        parts = os.path.abspath(site.filename).split(os.sep)
        if "inmanta_plugins" in parts and parts.index("inmanta_plugins") + 1 < len(parts):
            module = parts[parts.index("inmanta_plugins") + 1]
        elif "plugins" in parts and parts.index("plugins") > 0:
            module = parts[parts.index("plugins") - 1]
    who = f"the {module} module" if module else "this module"
    pin = f" (inmanta-module-{module})" if module else ""
    return (
        f"{where}{who} needs `{missing}`, which Steward does not provide: its `inmanta` package "
        f"offers the part of inmanta-core 14.0.0's API that modules use (docs/inmanta-modules.md "
        f"lists it and the module versions known to work). If this version of {who} was written "
        f"for a newer inmanta-core, pin one{pin} that works with inmanta-core 14.0.0 in "
        f"requirements.txt; if it needs the Inmanta server's own API, it does not run on Steward."
    )


def describe(e: BaseException) -> dict:
    """An exception as the compiler reports it: kind, message, the traceback of module code."""
    import traceback

    from inmanta.plugins import PluginException

    tb = e.__traceback__
    # leave out the host's own frames
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    text = "" if isinstance(e, UnsupportedInmantaApi) else "".join(traceback.format_exception(type(e), e, tb))
    if isinstance(e, PluginException):
        kind = "PluginException"
        message = e.message
    else:
        kind = type(e).__name__
        message = str(e)
    return {"kind": kind, "message": message, "traceback": text}


def search_path_reply() -> str:
    """The reply to "paths": `sys.path` as `python -I` has it (what the compiler asked before
    it started the host here), so without this host's own directory (the script's, and
    PYTHONPATH) and the user's site-packages; as a JSON line written without `json`."""
    site = sys.modules.get("site")
    own = os.path.dirname(os.path.abspath(__file__))
    user = site.USER_SITE if site is not None and site.ENABLE_USER_SITE else None
    paths = [p for p in sys.path if p and os.path.abspath(p) != own and p != user]
    return '{"ok":[' + ",".join(json_string(p) for p in paths) + "]}\n"


def json_string(text: str) -> str:
    """`text` as a JSON string in ASCII (as `json.dumps` writes it)."""
    out = []
    for c in text:
        n = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif 0x20 <= n < 0x7F:
            out.append(c)
        elif n > 0xFFFF:
            n -= 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 | (n >> 10), 0xDC00 | (n & 0x3FF)))
        else:
            out.append("\\u%04x" % n)
    return '"' + "".join(out) + '"'


def main() -> None:
    global HOST, importlib, json
    # module code reaches the host as `steward_plugin_host.HOST`, not a second copy of this file
    sys.modules.setdefault("steward_plugin_host", sys.modules[__name__])
    out = sys.stdout
    # what module code prints must not mix with the protocol
    sys.stdout = sys.stderr
    line = sys.stdin.readline()
    while line.strip() == PATHS_REQUEST:
        out.write(search_path_reply())
        out.flush()
        line = sys.stdin.readline()
    import importlib
    import importlib.util
    import json

    HOST = Host(sys.stdin, out)
    from inmanta.execute.proxy import UnknownException, UnsetException

    while line:
        if not line.strip():
            line = sys.stdin.readline()
            continue
        msg = json.loads(line)
        op = getattr(HOST, "op_" + msg.get("op", ""), None)
        try:
            if HOST.load_failure is None:
                if op is None:
                    raise ValueError(f"unknown operation {msg.get('op')!r}")
                reply = {"ok": op(msg)}
        except UnsetException as e:
            inst = e.instance
            reply = {"unset": [getattr(inst, "handle", None), e.attribute]}
        except UnknownException:
            reply = {"unknown": True}
        except Exception as e:  # noqa: BLE001 - every error goes back to the compiler
            reply = {"error": describe(e)}
        if HOST.load_failure is not None:
            # also when module code caught the ImportError: the reference would not have run
            reply = {"error": HOST.load_failure, "load": True}
        HOST.send(reply)
        line = sys.stdin.readline()


if __name__ == "__main__":
    main()
