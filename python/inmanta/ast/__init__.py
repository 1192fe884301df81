"""The exceptions of inmanta.ast that module code catches or raises."""

from typing import Optional


class Location:
    def __init__(self, file: str = "", lnr: int = 0) -> None:
        self.file = file
        self.lnr = lnr

    def __str__(self) -> str:
        return f"{self.file}:{self.lnr}"


class Locatable:
    def __init__(self) -> None:
        self.location: Optional[Location] = None

    def set_location(self, location: Location) -> None:
        self.location = location

    def get_location(self) -> Optional[Location]:
        return self.location


class CompilerException(Exception):
    """Base class of every error the compiler reports."""

    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self.msg = msg
        self.location: Optional[Location] = None

    def get_message(self) -> str:
        return self.msg

    def set_location(self, location: Location) -> None:
        self.location = location

    def format(self) -> str:
        return self.get_message()

    def __str__(self) -> str:
        return self.format()


class RuntimeException(CompilerException):
    """An error at run time of the model, optionally tied to a statement."""

    def __init__(self, stmt: object, msg: str) -> None:
        super().__init__(msg)
        self.stmt = stmt


class ExternalException(RuntimeException):
    """An exception raised by code outside the compiler (plugins, mappers)."""

    def __init__(self, stmt: object, msg: str, cause: Exception) -> None:
        super().__init__(stmt, msg)
        self.__cause__ = cause

    def format(self) -> str:
        return f"{self.msg}: {self.__cause__}"


class ExplicitPluginException(ExternalException):
    """A PluginException raised on purpose by plugin code."""


class WrappingRuntimeException(RuntimeException):
    def __init__(self, stmt: object, msg: str, cause: Exception) -> None:
        super().__init__(stmt, msg)
        self.__cause__ = cause


class TypingException(RuntimeException):
    pass


class NotFoundException(RuntimeException):
    def __init__(self, stmt: object, name: str, msg: Optional[str] = None) -> None:
        super().__init__(stmt, msg if msg is not None else f"could not find value {name}")
        self.name = name


class OptionalValueException(RuntimeException):
    """An optional attribute (`T?`) read while it is null."""

    def __init__(self, instance: object, attribute: object) -> None:
        super().__init__(None, f"Optional variable accessed that has no value (attribute `{attribute}` of `{instance}`)")
        self.instance = instance
        self.attribute = attribute


class DuplicateException(CompilerException):
    pass


class Namespace:
    """A module namespace (`std`, `mymod::sub`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get_full_name(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name
