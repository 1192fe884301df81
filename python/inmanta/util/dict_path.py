"""inmanta.util.dict_path: paths into nested dicts and lists (`a.b[name=x].c`).

Steward's compatibility package has the names (so modules that import them load) but not the
path language: `to_path` and `to_wild_path` raise a clear error. Used by `fs::JsonFile`'s
handler, which is therefore not supported yet."""


class InvalidPathException(Exception):
    pass


class ContainerStructureException(LookupError):
    pass


class WildDictPath:
    """A path that may match several places."""


class DictPath(WildDictPath):
    """A path to one place."""


def _unsupported(inp: str) -> "DictPath":
    raise InvalidPathException(
        f"dict paths ({inp!r}) are not supported by Steward's inmanta compatibility package yet"
    )


def to_path(inp: str) -> DictPath:
    return _unsupported(inp)


def to_wild_path(inp: str) -> WildDictPath:
    return _unsupported(inp)
