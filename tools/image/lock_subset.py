"""Prints the part of requirements.lock that an image needs, hashes and all.

Why: the lock pins every package of the project and all its extras (tests, fuzzing, Spark,
the native build), and pip's hash-checking mode installs a file whole. An image wants the
same pinned versions and hashes but only what runs in it, so this keeps the requirements
reachable from the chosen roots: pyproject.toml's dependencies, the named extras and, with
--build-system, its build requirements. Reachability follows pip-compile's `# via` notes
(X via Y: Y needs X). pip then checks the subset is closed: a package missing from it is
refused under --require-hashes, so a wrong cut fails the build instead of shipping.

Usage: python3 lock_subset.py LOCK PYPROJECT [--extra NAME]... [--build-system] [--only-extras]
"""

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_NOTE = re.compile(r"\(pyproject\.toml.*\)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return canonical(match.group(1))


@dataclass
class Pin:
    name: str
    lines: list[str] = field(default_factory=list)
    needed_by: set[str] = field(default_factory=set)


def parse_lock(text: str) -> dict[str, Pin]:
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            current = Pin(requirement_name(line.split("==")[0]))
            pins[current.name] = current
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("#"):
            note = stripped.lstrip("#").strip().removeprefix("via").strip()
            if note and not PROJECT_NOTE.search(note):
                current.needed_by.add(canonical(note))
        elif line:
            current.lines.append(line)
    return pins


def roots(pyproject: dict, extras: list[str], build_system: bool,
          only_extras: bool) -> set[str]:
    project = pyproject["project"]
    wanted = [] if only_extras else list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    if build_system:
        wanted += pyproject["build-system"]["requires"]
    return {requirement_name(requirement) for requirement in wanted}


def closure(pins: dict[str, Pin], start: set[str]) -> set[str]:
    missing = start - pins.keys()
    if missing:
        raise SystemExit(f"not in the lock: {sorted(missing)}")
    chosen = set(start)
    grew = True
    while grew:
        grew = False
        for pin in pins.values():
            if pin.name not in chosen and pin.needed_by & chosen:
                chosen.add(pin.name)
                grew = True
    return chosen


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock", type=Path)
    parser.add_argument("pyproject", type=Path)
    parser.add_argument("--extra", action="append", default=[])
    parser.add_argument("--build-system", action="store_true")
    parser.add_argument("--only-extras", action="store_true",
                        help="leave out the project's own dependencies")
    args = parser.parse_args(argv)
    pins = parse_lock(args.lock.read_text())
    pyproject = tomllib.loads(args.pyproject.read_text())
    chosen = closure(pins, roots(pyproject, args.extra, args.build_system, args.only_extras))
    for name in sorted(chosen):
        print("\n".join(pins[name].lines))


if __name__ == "__main__":
    main(sys.argv[1:])
