"""Build the wheel of a V2 module from its source tree, without a build backend (the test
environments have pip only): python make_wheel.py SRC DIST NAME VERSION [REQUIREMENT...].

SRC holds `inmanta_plugins/<module>/`; the wheel is written into DIST."""

import base64
import hashlib
import os
import sys
import zipfile

src, dist, name, version, *requires = sys.argv[1:]
dist_name = name.replace("-", "_")
info = f"{dist_name}-{version}.dist-info"
files = {}
for root, dirs, names in os.walk(os.path.join(src, "inmanta_plugins")):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for n in names:
        full = os.path.join(root, n)
        with open(full, "rb") as f:
            files[os.path.relpath(full, src)] = f.read()
meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
meta += [f"Requires-Dist: {r}" for r in requires]
files[f"{info}/METADATA"] = ("\n".join(meta) + "\n").encode()
files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: steward-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
files[f"{info}/top_level.txt"] = b"inmanta_plugins\n"
record = []
for path, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{path},sha256={digest},{len(data)}")
record.append(f"{info}/RECORD,,")
files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
os.makedirs(dist, exist_ok=True)
out = os.path.join(dist, f"{dist_name}-{version}-py3-none-any.whl")
with zipfile.ZipFile(out, "w") as z:
    for path, data in files.items():
        z.writestr(path, data)
print(out)
