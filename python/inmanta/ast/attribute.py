"""inmanta.ast.attribute: the kinds of attributes of an entity, for module code that imports
them (annotations, isinstance checks), and what `proxy._type().get_attribute(name)` returns."""


class Attribute:
    """A plain attribute of an entity."""

    def __init__(self, entity: object, value_type: object, name: str) -> None:
        self.entity = entity
        self.type = value_type
        self.name = name

    def get_name(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class RelationAttribute(Attribute):
    """One end of a relation."""

    def __init__(self, entity: object, value_type: object, name: str) -> None:
        super().__init__(entity, value_type, name)
        self.end: "RelationAttribute | None" = None
        self.low = 1
        self.high = 1
