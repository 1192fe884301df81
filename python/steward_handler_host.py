"""Steward's handler host: runs an Inmanta module's `@provider` handlers in an executor.

Started by the executor (src/executor/inmanta.rs) with the `inmanta` compatibility package and
the module code on `sys.path`, it speaks the JSON-lines protocol of docs/integrations.md on
stdin/stdout (stdout is reserved for the protocol: `print` goes to stderr):

    hello          import the packages named in `imports` (so their `@provider` classes
                   register); answers the resource types that have a handler
    execute        deserialize the resource, run the handler's own `deploy` (or `execute`
                   with dry_run=True in a dry-run), answer status, change, changes, logs and
                   the facts it set (`ctx.set_fact`)
    facts          run the handler's `check_facts` (its `facts()`), answer them with those
                   it set and the logs

During `execute` and `facts`, a handler's `get_client()` calls go out as
`{"call": METHOD, "args": {...}, "call_id": N}` and the host reads the line
`{"answer": N, "code": ..., "result": ...}` before it goes on (src/executor/calls.rs).
    version_done   the deploy of a version is done: drop the cache entries bound to it
    shutdown       close the cache (running `call_on_delete`) and exit
"""

import importlib
import json
import logging
import os
import sys
import traceback
import uuid


class _Agent:
    """What a handler sees of its agent (`self._agent`)."""

    def __init__(self) -> None:
        self.name = ""
        self.environment = None
        self.uri = "local:"
        self.eventloop = None
        self.sessionid = None
        self.reload_requested = False
        self._files_dirs = [d for d in os.environ.get("STEWARD_INMANTA_FILES", "").split(os.pathsep) if d]

    def get_file(self, hash_id: str):
        """A file the export uploaded, by its sha1: shipped with the handler code under
        `_files/<sha1>` (the code directory is the host's working directory), or found in a
        directory of `$STEWARD_INMANTA_FILES`."""
        if not all(c in "0123456789abcdef" for c in hash_id):
            return None
        for d in [os.path.join(os.getcwd(), "_files")] + self._files_dirs:
            path = os.path.join(d, hash_id)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    return f.read()
        return None

    def upload_file(self, hash_id: str, content: bytes) -> None:
        raise Exception("uploading files from a handler is not supported by Steward")


def _json_default(o):
    if hasattr(o, "value") and isinstance(o.value, (str, int)):
        return o.value
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


class Host:
    def __init__(self, out=None) -> None:
        import threading

        from inmanta import protocol
        from inmanta.agent.cache import AgentCache

        self.cache = AgentCache()
        self.agent = _Agent()
        self.imported: list[str] = []
        self.out = out
        self.calls = 0
        # a handler's threads may call too: one call on the line at a time
        self.call_lock = threading.Lock()
        protocol._transport = self.call_server

    def call_server(self, method: str, args: dict) -> tuple:
        """One call of a handler's client: files from what was shipped, the rest from the
        executor, whose answer is the next line on stdin with this call's id."""
        import base64

        if method in ("get_file", "stat_file"):
            content = self.agent.get_file(str(args.get("id", "")))
            if content is None:
                return 404, {"message": f"no file {args.get('id')}"}
            return 200, ({"content": base64.b64encode(content).decode("ascii")} if method == "get_file" else {})
        if self.out is None:
            return 503, {"message": "this handler host has no link to the server"}
        with self.call_lock:
            self.calls += 1
            call_id = self.calls
            self.out.write(json.dumps({"call": method, "args": args, "call_id": call_id}, default=_json_default) + "\n")
            self.out.flush()
            while True:
                line = sys.stdin.readline()
                if not line:
                    return 503, {"message": "the executor closed the handler host's input"}
                line = line.strip()
                if not line:
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("answer") == call_id:
                    return int(msg.get("code") or 500), msg.get("result")

    def hello(self, req: dict) -> dict:
        from inmanta.agent import handler

        for name in req.get("imports", []):
            try:
                importlib.import_module(name)
            except BaseException as e:  # noqa: B902 (SystemExit from module code too)
                return {
                    "ok": False,
                    "error": f"importing {name} failed: {e.__class__.__name__}: {e}",
                    "traceback": traceback.format_exc(),
                }
            self.imported.append(name)
        return {"ok": True, "protocol": 1, "providers": sorted(handler.Commander.get_handlers())}

    def execute(self, req: dict) -> dict:
        return self._run(req, facts=False)

    def facts(self, req: dict) -> dict:
        return self._run(req, facts=True)

    def _run(self, req: dict, facts: bool) -> dict:
        from inmanta import const, resources
        from inmanta.agent import handler

        r = req["resource"]
        version = int(req.get("version") or 0)
        dry_run = bool(req.get("dry_run"))
        rtype = r["type"]
        if handler.Commander.get_provider_class(rtype, "") is None:
            return {
                "ok": True,
                "status": "unavailable",
                "logs": [
                    {
                        "level": "error",
                        "message": f"no @provider handler is registered for {rtype} (imported: {', '.join(self.imported) or 'nothing'})",
                        "fields": {"resource_type": rtype},
                    }
                ],
            }
        obj = dict(r.get("attributes") or {})
        obj["id"] = f"{r['id']},v={version}"
        obj["requires"] = [q if ",v=" in q else f"{q},v={version}" for q in r.get("requires", [])]
        try:
            resource = resources.Resource.deserialize(obj)
        except Exception as e:
            return {
                "ok": True,
                "status": "unavailable",
                "logs": [
                    {
                        "level": "error",
                        "message": f"the resource can not be deserialized: {e.__class__.__name__}: {e}",
                        "fields": {"traceback": traceback.format_exc()},
                    }
                ],
            }
        action_id = None
        if req.get("action_id"):
            try:
                action_id = uuid.UUID(req["action_id"])
            except ValueError:
                pass
        ctx = handler.HandlerContext(resource, dry_run, action_id=action_id)
        self.agent.name = r.get("agent", "")
        if req.get("environment"):
            try:
                self.agent.environment = uuid.UUID(str(req["environment"]))
            except ValueError:
                self.agent.environment = None
        self.agent.reload_requested = bool(req.get("reload"))
        self.cache.open_version(version)
        provider = None
        with self.cache:
            try:
                provider = handler.Commander.get_provider(self.agent, resource)
                provider.set_cache(self.cache)
            except Exception:
                ctx.set_status(const.ResourceState.unavailable)
                ctx.exception("Unable to find a handler for %(resource_id)s", resource_id=resource.id.resource_version_str())
            else:
                try:
                    if facts:
                        for name, value in (provider.check_facts(ctx, resource) or {}).items():
                            ctx.set_fact(name, value)
                        ctx.set_status(const.ResourceState.dry)
                    elif dry_run:
                        provider.execute(ctx, resource, dry_run=True)
                    else:
                        provider.deploy(ctx, resource, {})
                    if ctx.status is None:
                        ctx.set_status(const.ResourceState.dry if dry_run else const.ResourceState.deployed)
                except handler.SkipResource as e:
                    ctx.set_status(const.ResourceState.skipped)
                    ctx.warning(msg="Resource %(resource_id)s was skipped: %(reason)s", resource_id=resource.id, reason=e.args)
                except Exception as e:
                    ctx.set_status(const.ResourceState.failed)
                    ctx.exception(
                        "An error occurred during deployment of %(resource_id)s (exception: %(exception)s)",
                        resource_id=resource.id,
                        exception=repr(e),
                    )
            finally:
                if provider is not None:
                    try:
                        provider.close()
                    except Exception:
                        ctx.exception("closing the handler failed")
        return {
            "ok": True,
            "status": ctx.status.value if ctx.status is not None else "failed",
            "change": ctx.change.value,
            "changes": ctx.changes,
            "logs": ctx.logs,
            "facts": [
                {"id": f["id"], "value": f["value"] if isinstance(f["value"], str) else json.dumps(f["value"], default=_json_default), "expires": f.get("expires", True)}
                for f in ctx.facts
            ],
        }

    def version_done(self, req: dict) -> dict:
        return {"ok": True, "dropped": self.cache.close_version(int(req["version"]))}


def prefer_shipped_modules() -> None:
    """Steward's own `inmanta_plugins.std` (the helpers of its built-in std) comes after the
    shipped code: a version that pinned the real std ships it, and its `resources` and
    handlers must be the ones imported."""
    import inmanta_plugins

    ours = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inmanta_plugins")
    paths = list(inmanta_plugins.__path__)
    if ours in paths:
        inmanta_plugins.__path__ = [p for p in paths if p != ours] + [ours]


def main() -> None:
    prefer_shipped_modules()
    # module code that prints must not break the protocol, nor the commands it starts
    # (they inherit file descriptor 1): the protocol gets a descriptor of its own and 1
    # becomes stderr
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    host = Host(out)
    ops = {"hello": host.hello, "execute": host.execute, "facts": host.facts, "version_done": host.version_done}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            print(f"handler host: bad request line: {e}", file=sys.stderr)
            continue
        op = req.get("op")
        if op == "shutdown":
            break
        fn = ops.get(op)
        try:
            answer = fn(req) if fn else {"ok": False, "error": f"unknown op {op!r}"}
        except BaseException as e:  # noqa: B902
            answer = {"ok": False, "error": f"{e.__class__.__name__}: {e}", "traceback": traceback.format_exc()}
        answer["id"] = req.get("id")
        try:
            text = json.dumps(answer, default=_json_default)
        except (TypeError, ValueError) as e:
            text = json.dumps({"id": req.get("id"), "ok": False, "error": f"the answer is not JSON: {e}"})
        out.write(text + "\n")
        out.flush()
    host.cache.close()


if __name__ == "__main__":
    main()
