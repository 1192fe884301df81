"""Inmanta keeps `Result` here too."""

from inmanta.protocol import Result  # noqa: F401
