"""Steward's light compatibility package for Inmanta modules.

This is not inmanta-core: it holds the API surface that module code imports (plugins,
resources, proxies, handlers), written for Steward's compiler plugin host and executors.
"""

COMPILER_VERSION = "14.0.0"
