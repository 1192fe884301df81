"""inmanta.data.model: the names of inmanta-core 14's stable API that module code uses in its
type annotations (the podman module's discovery handlers return
`Mapping[inmanta.data.model.ResourceIdStr, ...]`). The server's pydantic models are not
here: Steward keeps its own API types."""

from typing import NewType

ResourceVersionIdStr = NewType("ResourceVersionIdStr", str)
"""The resource id with the version included."""

ResourceIdStr = NewType("ResourceIdStr", str)
"""The resource id without the version."""

ResourceType = NewType("ResourceType", str)
"""The type of the resource."""

__all__ = ["ResourceIdStr", "ResourceType", "ResourceVersionIdStr"]
