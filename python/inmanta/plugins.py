"""Plugins (`@plugin` functions the model calls). Filled in by the plugin host work."""


class PluginException(Exception):
    """An exception a plugin raises on purpose: reported without the Python traceback's noise."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
