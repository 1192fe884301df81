"""Record what the reference (inmanta-core 14.0.0, inmanta-module-std 8.1.0) does with each
case of this directory: run with the reference's interpreter, by hand, never by the tests.

    ~/inmanta-ref/bin/python tests/facts/record.py [CASE ...]

Each case is compiled in a fresh copy, in a process of its own (the reference keeps the
recorded unknowns and std's fact cache in module globals), with the facts of its
`facts.json` handed to the reference's own mock of the server's facts
(`do_compile(refs={"facts": {resource_id: {name: value}}})`, what pytest-inmanta uses: a fact
it has is the value, one it has not is recorded and unknown, as with a server). Writes
`expected.json`: the `std::print` output and `inmanta.export.unknown_parameters` as the
reference would send them with the version (in call order, repeats included).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT_YML = "name: facts\nmodulepath: libs\ndownloadpath: libs\ninstall_mode: release\n"


def one(project: str, facts_file: str, out_file: str) -> None:
    """In the child: compile `project` (the working directory) with the facts."""
    from inmanta import compiler, export, module

    refs: dict = {}
    with open(facts_file) as f:
        for row in json.load(f)["parameters"]:
            refs.setdefault(row["resource_id"], {})[row["name"]] = row["value"]
    module.Project.get("main.cf")
    module.Project.get().load()
    compiler.do_compile(refs={"facts": refs})
    with open(out_file, "w") as f:
        json.dump(export.unknown_parameters, f)


def record(case: str) -> None:
    src = os.path.join(HERE, case)
    with tempfile.TemporaryDirectory() as tmp:
        project = os.path.join(tmp, "project")
        shutil.copytree(src, project, ignore=shutil.ignore_patterns("expected.json", "facts.json"))
        with open(os.path.join(project, "project.yml"), "w") as f:
            f.write(PROJECT_YML)
        unknowns = os.path.join(tmp, "unknowns.json")
        run = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--one", os.path.join(src, "facts.json"), unknowns],
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if run.returncode != 0:
            sys.exit(f"{case}: the reference failed:\n{run.stderr}")
        # the reference writes its log lines to stdout too
        printed = [
            line
            for line in run.stdout.splitlines()
            if not line.startswith("Module ") and "InmantaWarning" not in line
        ]
        with open(unknowns) as f:
            expected = {"printed": printed, "unknowns": json.load(f)}
    with open(os.path.join(src, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    print(f"{case}: {expected}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        one(os.getcwd(), sys.argv[2], sys.argv[3])
    else:
        cases = sys.argv[1:] or sorted(d for d in os.listdir(HERE) if os.path.isfile(os.path.join(HERE, d, "main.cf")))
        for c in cases:
            record(c)
