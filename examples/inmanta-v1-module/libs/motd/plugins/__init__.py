"""The motd module's Python: a plugin, a resource definition and its handler, as the Inmanta
documentation's guides write them (module developer guide: plugins, resources, handlers)."""

import os
import socket

from inmanta.agent.handler import CRUDHandler, HandlerContext, ResourcePurged, cache, provider
from inmanta.execute.proxy import DynamicProxy
from inmanta.plugins import Context, plugin
from inmanta.resources import PurgeableResource, resource


@plugin
def greeting(host: "std::Host", context: Context) -> "string":
    """The greeting for a host: its name, and the environment that deploys it (when the
    compile belongs to one)."""
    try:
        where = f" (environment {context.get_environment_id()})"
    except Exception:
        where = ""
    return f"Welcome to {host.name}{where}"


@resource("motd::Message", agent="host.name", id_attribute="path")
class Message(PurgeableResource):
    fields = ("path", "content", "mode")

    @staticmethod
    def get_content(exporter, message: DynamicProxy) -> str:
        return message.text.strip() + "\n"

    @staticmethod
    def get_mode(exporter, message: DynamicProxy) -> int:
        return int(str(message.mode), 8)


@provider("motd::Message", name="motd")
class MessageHandler(CRUDHandler[Message]):
    @cache(for_version=True)
    def signature(self) -> str:
        """Looked up once per version deployed, whatever the number of messages."""
        return f"-- {socket.gethostname()}"

    def read_resource(self, ctx: HandlerContext, resource: Message) -> None:
        if not os.path.exists(resource.path):
            raise ResourcePurged()
        with open(resource.path) as f:
            resource.content = f.read().removesuffix(self.signature() + "\n")
        resource.mode = os.stat(resource.path).st_mode & 0o777

    def create_resource(self, ctx: HandlerContext, resource: Message) -> None:
        self._write(ctx, resource)
        ctx.set_created()

    def update_resource(self, ctx: HandlerContext, changes: dict, resource: Message) -> None:
        self._write(ctx, resource)
        ctx.set_updated()

    def delete_resource(self, ctx: HandlerContext, resource: Message) -> None:
        os.remove(resource.path)
        ctx.info("removed %(path)s", path=resource.path)
        ctx.set_purged()

    def _write(self, ctx: HandlerContext, resource: Message) -> None:
        os.makedirs(os.path.dirname(resource.path), exist_ok=True)
        text = resource.content + self.signature() + "\n"
        with open(resource.path, "w") as f:
            f.write(text)
        os.chmod(resource.path, resource.mode)
        ctx.info("wrote %(path)s", path=resource.path, bytes=len(text), mode=oct(resource.mode))
