"""What handlers use of Inmanta's client: `Result`, and the session client their
`get_client()` returns.

Steward's handler host carries a call to whoever runs the executor (the server's scheduler,
or an external agent with its token), which answers with an agent's rights: the
environment's parameters and the facts of the agent's resources, read; those facts, written.
The methods and arguments are Inmanta's (`get_param`, `set_param`, `set_parameters`,
`list_params`, `get_environment`, and v2 `get_facts`, `get_fact`, `set_fact`,
`get_parameters`, `environment_get`); any other answers 501 with what is offered. Like
Inmanta's client, a method returns an awaitable `Result` (use the handler's `run_sync`).
"""

from typing import Any, Callable, Optional

# Set by the handler host: (method, keyword arguments) -> (code, result).
_transport: Optional[Callable[[str, dict], tuple]] = None

# Positional arguments of the offered methods, in Inmanta's order.
_POSITIONAL = {
    "get_param": ("tid", "id", "resource_id"),
    "set_param": ("tid", "id", "source", "value", "resource_id", "metadata", "recompile", "expires"),
    "set_parameters": ("tid", "parameters"),
    "list_params": ("tid", "query"),
    "get_environment": ("id",),
    "environment_get": ("id",),
    "get_facts": ("tid", "rid"),
    "get_fact": ("tid", "rid", "id"),
    "set_fact": ("tid", "name", "source", "value", "resource_id", "metadata", "recompile", "expires"),
    "get_parameters": ("tid",),
    "get_file": ("id",),
    "stat_file": ("id",),
}


class Result:
    """The outcome of a call: an HTTP-like `code` and the `result` (a dict)."""

    def __init__(self, code: int = 0, result: Optional[dict] = None) -> None:
        self.code = code
        self.result = result

    def __repr__(self) -> str:
        return f"Result(code={self.code}, result={self.result!r})"


def _call(method: str, args: tuple, kwargs: dict) -> Result:
    names = _POSITIONAL.get(method, ())
    if len(args) > len(names):
        raise TypeError(f"{method}() takes at most {len(names)} positional arguments ({len(args)} given)")
    kwargs = dict(kwargs)
    kwargs.update(zip(names, args))
    if _transport is None:
        return Result(503, {"message": "no server to call: this code does not run in Steward's handler host"})
    code, result = _transport(method, kwargs)
    return Result(code, result)


class SessionClient:
    """A client scoped to the agent's environment; each method returns an awaitable `Result`."""

    def __init__(self, name: str = "agent", sid: Any = None, timeout: int = 120) -> None:
        self.name = name
        self.sid = sid

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        async def call(*args: Any, **kwargs: Any) -> Result:
            return _call(method, args, kwargs)

        call.__name__ = method
        return call


Client = SessionClient


class SyncClient:
    """The same calls, answered at once (Inmanta's `SyncClient`)."""

    def __init__(self, name: str = "agent", timeout: int = 120, client: Any = None, ioloop: Any = None) -> None:
        self.name = name

    def __getattr__(self, method: str) -> Callable[..., Result]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Result:
            return _call(method, args, kwargs)

        call.__name__ = method
        return call
