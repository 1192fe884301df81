"""The handler of inifile::Entry: reads and writes keys of INI files with configparser.

Steward asks read_resource what is there and, by comparing with the desired attributes,
decides whether to create, update or delete (or only report, in a dry-run).
"""

import configparser
import os
import tempfile

from steward_handler import CRUDHandler, HandlerError, serve

# written into every file this handler touches; tests use it to see which code ran
HEADER = "; managed by steward (inifile handler 1)\n"


def load(path):
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # keys keep their case
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    return parser


def save(path, parser):
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise HandlerError("directory %s does not exist" % directory)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".inifile-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(HEADER)
        parser.write(f)
    os.replace(tmp, path)


class EntryHandler(CRUDHandler):
    def read_resource(self, ctx, resource):
        parser = load(resource.file)
        if not parser.has_option(resource.section, resource.key):
            return None
        return {"value": parser.get(resource.section, resource.key)}

    def create_resource(self, ctx, resource):
        parser = load(resource.file)
        if not parser.has_section(resource.section):
            parser.add_section(resource.section)
        parser.set(resource.section, resource.key, resource.value)
        save(resource.file, parser)
        ctx.info("entry written", file=resource.file, section=resource.section, key=resource.key)

    def update_resource(self, ctx, changes, resource):
        parser = load(resource.file)
        parser.set(resource.section, resource.key, resource.value)
        save(resource.file, parser)
        ctx.info("entry updated", file=resource.file, key=resource.key, was=changes.get("value", {}).get("current"))

    def delete_resource(self, ctx, resource):
        parser = load(resource.file)
        parser.remove_option(resource.section, resource.key)
        if not parser.options(resource.section):
            parser.remove_section(resource.section)
        save(resource.file, parser)
        ctx.info("entry removed", file=resource.file, section=resource.section, key=resource.key)


if __name__ == "__main__":
    serve(EntryHandler())
