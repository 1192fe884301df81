"""Write steward handlers in Python: the CRUD shape over steward's handler protocol.

A module ships a handler next to its model (see docs/integrations.md):

    from steward_handler import CRUDHandler, serve

    class EntryHandler(CRUDHandler):
        def read_resource(self, ctx, resource):
            ...                      # return the current attributes, or None if it does not exist
        def create_resource(self, ctx, resource): ...
        def update_resource(self, ctx, changes, resource): ...
        def delete_resource(self, ctx, resource): ...

    serve(EntryHandler())            # or serve({"mymod::Entry": EntryHandler(), ...})

Steward decides what to do: it asks `read_resource`, compares the answer with the desired
attributes, and then calls create, update or delete (or nothing, or only reports in a dry-run).
Standard library only. The process is long-lived: keep connections in `ctx.cache`.

Protocol (one JSON document per line; stdout is reserved for it, so print() goes to stderr):
    -> {"id": 1, "op": "hello", "protocol": 1}
    <- {"id": 1, "ok": true, "protocol": 1, "can_reload": false}
    -> {"id": 2, "op": "read", "resource": {"id", "type", "agent", "attributes"}, "dry_run", "reload", "version"}
    <- {"id": 2, "ok": true, "state": {...} | null, "logs": [{"level", "message", "fields"}]}
    -> {"id": 3, "op": "update", "resource": {...}, "changes": {"attr": {"current", "desired"}}}
    <- {"id": 3, "ok": true, "logs": [...]}
    errors: {"id": n, "ok": false, "error": "message"}; skips: {"id": n, "ok": false, "skip": "reason"}
"""

import json
import sys
import time
import traceback

PROTOCOL = 1

__all__ = [
    "CRUDHandler",
    "Cache",
    "Context",
    "HandlerError",
    "Resource",
    "SkipResource",
    "SkipForDependencies",
    "serve",
]


class HandlerError(Exception):
    """The action failed (the message is the resource's last message)."""


class SkipResource(Exception):
    """Nothing can be done now; steward retries later like a failure."""


class SkipForDependencies(Exception):
    """Wait until the resource's requirements are deployed."""


class Resource:
    """The desired state of one resource: `resource.id`, `.type`, `.agent`, `.attributes`,
    and its attributes as `resource["name"]` or `resource.name`."""

    def __init__(self, doc):
        self.id = doc.get("id")
        self.type = doc.get("type")
        self.agent = doc.get("agent")
        self.attributes = doc.get("attributes") or {}

    def __getitem__(self, name):
        return self.attributes[name]

    def __getattr__(self, name):
        try:
            return self.attributes[name]
        except KeyError:
            raise AttributeError(name) from None

    def get(self, name, default=None):
        return self.attributes.get(name, default)

    def __repr__(self):
        return "Resource(%s)" % self.id


class Cache:
    """Values kept across actions of this handler process.

    An entry expires `timeout` seconds after it was last used (None: never), or when an action
    of another model version starts (`per_version=True`); `on_expire(value)` runs once when it
    goes, e.g. to close a connection.
    """

    def __init__(self):
        self._entries = {}
        self._version = None

    def _expire(self, key):
        entry = self._entries.pop(key, None)
        if entry and entry["on_expire"]:
            try:
                entry["on_expire"](entry["value"])
            except Exception:  # a hook must not take the handler down
                traceback.print_exc(file=sys.stderr)

    def _tick(self, version):
        now = time.monotonic()
        for key, entry in list(self._entries.items()):
            stale = entry["timeout"] is not None and now - entry["used"] > entry["timeout"]
            other_version = entry["per_version"] and version is not None and entry["version"] != version
            if stale or other_version:
                self._expire(key)
        self._version = version

    def get(self, key, default=None):
        entry = self._entries.get(key)
        if entry is None:
            return default
        entry["used"] = time.monotonic()
        return entry["value"]

    def set(self, key, value, timeout=60.0, per_version=False, on_expire=None):
        if key in self._entries:
            self._expire(key)
        self._entries[key] = {
            "value": value,
            "timeout": timeout,
            "per_version": per_version,
            "version": self._version,
            "used": time.monotonic(),
            "on_expire": on_expire,
        }

    def get_or_set(self, key, make, **policy):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            value = make()
            self.set(key, value, **policy)
        return value

    def clear(self):
        for key in list(self._entries):
            self._expire(key)


_MISSING = object()


class Context:
    """What a handler method gets besides the resource: logging with keyword fields, the
    cache, and how the action runs (`dry_run`, `reload`, `version`)."""

    def __init__(self, request, cache):
        self.dry_run = bool(request.get("dry_run"))
        self.reload = bool(request.get("reload"))
        self.version = request.get("version")
        self.cache = cache
        self.logs = []

    def log(self, level, message, **fields):
        self.logs.append({"level": level, "message": str(message), "fields": _jsonable(fields)})

    def debug(self, message, **fields):
        self.log("debug", message, **fields)

    def info(self, message, **fields):
        self.log("info", message, **fields)

    def warning(self, message, **fields):
        self.log("warning", message, **fields)

    def error(self, message, **fields):
        self.log("error", message, **fields)


def _jsonable(fields):
    out = {}
    for k, v in fields.items():
        try:
            json.dumps(v)
            out[k] = v
        except (TypeError, ValueError):
            out[k] = repr(v)
    return out


class CRUDHandler:
    """Override the four methods; steward calls them in the right order."""

    #: set True and implement `reload_resource` to be told when a requirement changed
    can_reload = False

    def read_resource(self, ctx, resource):
        """Return the current attributes (a dict; the ones you leave out are taken as they
        should be), or None when the resource does not exist."""
        raise NotImplementedError("read_resource")

    def create_resource(self, ctx, resource):
        raise NotImplementedError("create_resource")

    def update_resource(self, ctx, changes, resource):
        """`changes` maps each differing attribute to {"current": …, "desired": …}."""
        raise NotImplementedError("update_resource")

    def delete_resource(self, ctx, resource):
        raise NotImplementedError("delete_resource")

    def reload_resource(self, ctx, resource):
        pass


def serve(handlers):
    """Answer steward's requests on stdin/stdout until it says goodbye. `handlers` is one
    CRUDHandler (for every resource type of the module) or a dict type name -> handler."""
    out = sys.stdout
    # print() in a handler must not break the protocol: it goes to the log (stderr)
    sys.stdout = sys.stderr
    cache = Cache()

    def handler_for(resource):
        if isinstance(handlers, dict):
            h = handlers.get(resource.type)
            if h is None:
                raise HandlerError("this handler does not know resource type %s" % resource.type)
            return h
        return handlers

    def answer(doc):
        out.write(json.dumps(doc) + "\n")
        out.flush()

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            request = json.loads(line)
        except ValueError:
            print("steward_handler: unreadable request: %r" % line[:200], file=sys.stderr)
            continue
        rid = request.get("id")
        op = request.get("op")
        if op == "shutdown":
            break
        if op == "hello":
            can_reload = any(h.can_reload for h in (handlers.values() if isinstance(handlers, dict) else [handlers]))
            answer({"id": rid, "ok": True, "protocol": PROTOCOL, "can_reload": can_reload})
            continue
        cache._tick(request.get("version"))
        ctx = Context(request, cache)
        reply = {"id": rid, "ok": True}
        try:
            resource = Resource(request.get("resource") or {})
            h = handler_for(resource)
            if op == "read":
                state = h.read_resource(ctx, resource)
                if state is not None and not isinstance(state, dict):
                    raise HandlerError("read_resource must return a dict or None, not %s" % type(state).__name__)
                reply["state"] = state
            elif op == "create":
                h.create_resource(ctx, resource)
            elif op == "update":
                h.update_resource(ctx, request.get("changes") or {}, resource)
            elif op == "delete":
                h.delete_resource(ctx, resource)
            elif op == "reload":
                h.reload_resource(ctx, resource)
            else:
                raise HandlerError("unknown operation %r" % op)
        except SkipResource as e:
            reply = {"id": rid, "ok": False, "skip": str(e) or "skipped"}
        except SkipForDependencies as e:
            reply = {"id": rid, "ok": False, "skip_for_dependencies": str(e) or "waiting for dependencies"}
        except HandlerError as e:
            reply = {"id": rid, "ok": False, "error": str(e)}
        except Exception as e:  # a bug in the handler: report it, keep serving
            traceback.print_exc(file=sys.stderr)
            reply = {"id": rid, "ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        reply["logs"] = ctx.logs
        answer(reply)
    cache.clear()
