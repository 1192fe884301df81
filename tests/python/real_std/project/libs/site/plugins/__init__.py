"""A project-local V1 module's Python: a plugin that calls into the real std's Python."""

from inmanta.plugins import plugin
from inmanta_plugins import std


@plugin
def shout(text: "string") -> "string":
    return std.upper(text) + "!"
