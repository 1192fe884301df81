"""A V2 module as the Inmanta guides write one: a plugin, a resource with a mapper, an
exporter hook and a handler."""

from inmanta.export import dependency_manager
from inmanta.plugins import Context, plugin
from inmanta.resources import IgnoreResourceException, ManagedResource, PurgeableResource, resource
from inmanta_plugins.std import get_file_content

try:
    from inmanta.agent.handler import CRUDHandler, provider
except ImportError:  # the compiler alone: the executor's API is not needed to export
    CRUDHandler = object

    def provider(*args, **kwargs):
        return lambda cls: cls


@plugin
def banner(ctx: Context, site: "v2demo::Site") -> "string":
    return get_file_content(ctx, "files", "v2demo/banner.txt").strip().format(name=site.name)


@resource("v2demo::Site", agent="agent", id_attribute="name")
class Site(PurgeableResource, ManagedResource):
    fields = ("name", "text")

    @staticmethod
    def get_text(exporter, obj):
        if obj.name.startswith("ignored"):
            raise IgnoreResourceException()
        return f"{obj.greeting}, {obj.name}"


@dependency_manager
def site_order(model, resources):
    """Each site requires the sites in its `site_requires` relation."""
    by_name = {r.name: r for r in resources.values()}
    for site in model.get("v2demo::Site", []):
        me = by_name.get(site.name)
        if me is None:
            continue
        for other in site.site_requires:
            if other.name in by_name:
                me.requires.add(by_name[other.name].id)


@provider("v2demo::Site", name="site")
class SiteHandler(CRUDHandler):
    pass
