"""Build a wheel from a directory tree, for tests (no build backend, standard library only).

    python3 make_wheel.py SRC_DIR DIST_NAME VERSION OUT_DIR [REQUIRES ...]

Every file under SRC_DIR goes into the wheel at its relative path; the dist-info gets
METADATA (with Requires-Dist lines), WHEEL and a RECORD with hashes. Prints the wheel's path.
"""

import base64
import hashlib
import os
import sys
import zipfile


def main():
    src, name, version, out = sys.argv[1:5]
    requires = sys.argv[5:]
    norm = name.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    files = {}
    for root, _dirs, names in os.walk(src):
        for n in names:
            path = os.path.join(root, n)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            with open(path, "rb") as f:
                files[rel] = f.read()
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files[f"{info}/METADATA"] = meta.encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: steward-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for rel, data in sorted(files.items()):
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{rel},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    os.makedirs(out, exist_ok=True)
    wheel = os.path.join(out, f"{norm}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, data in sorted(files.items()):
            z.writestr(rel, data)
    print(wheel)


if __name__ == "__main__":
    main()
