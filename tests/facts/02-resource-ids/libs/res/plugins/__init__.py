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
