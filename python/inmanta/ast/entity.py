"""inmanta.ast.entity: the type of an entity, as module code names it in annotations and
isinstance checks. In Steward it is the type a proxy's `_type()` returns."""

from inmanta.execute.proxy import EntityType as Entity

__all__ = ["Entity"]
