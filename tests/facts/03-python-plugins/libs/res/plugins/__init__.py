from inmanta.resources import resource, PurgeableResource

@resource("res::Thing", agent="host.name", id_attribute="name")
class Thing(PurgeableResource):
    fields = ("name",)

@resource("res::Mapped", agent="host.name", id_attribute="key")
class Mapped(PurgeableResource):
    fields = ("key",)

    @staticmethod
    def get_key(exporter, obj):
        return obj.name.upper()

import inmanta_plugins.std as std
from inmanta.plugins import plugin, Context


@plugin
def fact_of(ctx: Context, r: "std::Entity", name: "string") -> "any":
    return std.getfact(ctx, r, name)


@plugin
def fact_or(ctx: Context, r: "std::Entity", name: "string", d: "string") -> "string":
    return std.getfact(ctx, r, name, default_value=d)


@plugin
def fact_of_nonresource(ctx: Context, r: "std::Entity") -> "any":
    return std.getfact(ctx, r, "x")
