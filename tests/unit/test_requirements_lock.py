"""requirements.lock, what `make install` installs, still fits pyproject.toml: a dependency
added to pyproject.toml without `make lock`, or a range moved past the pinned version, fails
here rather than on a fresh machine (where --require-hashes refuses anything unpinned)."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def _pins() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) for every pin in the lock."""
    pins: dict[str, tuple[str, int]] = {}
    name = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if match := _PIN.match(line):
            name = canonicalize_name(match.group(1))
            pins[name] = (match.group(2).rstrip("\\ "), 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = pins[name]
            pins[name] = (version, hashes + 1)
    return pins


def _declared() -> list[Requirement]:
    """The project's dependencies, every extra `make install` installs, the build backend."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    lines = [*project["dependencies"], *pyproject["build-system"]["requires"]]
    for extra in project["optional-dependencies"].values():
        lines += extra
    return [Requirement(line) for line in lines]


def test_every_declared_dependency_is_pinned_within_its_range_with_hashes() -> None:
    pins = _pins()
    for requirement in _declared():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements.lock: run make lock"
        version, hashes = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements.lock pins {name}=={version}, outside {requirement}: run make lock")
        assert hashes, f"{name} has no hash in requirements.lock"


def test_make_install_installs_the_lock_compiled_with_every_extra() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"])
    makefile = (ROOT / "Makefile").read_text()
    compiled = re.search(r"--extra (\S+)", makefile)
    assert compiled is not None and set(compiled[1].split(",")) == extras
    assert "--require-hashes -r $(LOCK)" in makefile
    assert "#    make lock\n" in (ROOT / "requirements.lock").read_text()
