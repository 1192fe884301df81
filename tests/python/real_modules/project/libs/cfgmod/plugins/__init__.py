from inmanta.plugins import plugin, Context
from inmanta.resources import resource, PurgeableResource


@plugin
def describe(svc: "cfgmod::Service", ctx: Context) -> "string":
    return "%s:%d (%d deps)" % (svc.name, svc.port, len(svc.deps))


@plugin
def valid_port(n: "int") -> "bool":
    return 0 < n < 65536


@resource("cfgmod::Marker", agent="agent", id_attribute="name")
class Marker(PurgeableResource):
    fields = ("name", "port", "description")

    @staticmethod
    def get_description(exporter, obj):
        return "%s on %s" % (obj.service.name, obj.service.net)
