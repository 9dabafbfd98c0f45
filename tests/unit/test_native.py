"""The guard against stale compiled modules, and that a native build really is in use."""

import hashlib
import importlib
import json
import os
from pathlib import Path

import pytest

from broker import native
from broker.native import MANIFEST, StaleNativeBuild, check


def _package(root: Path, compiled: bool, manifest: bool, stats: bool = False) -> Path:
    """`stats`: the manifest records the source's size and mtime, as tools/build_native.py
    writes it (without: a manifest from before they were recorded, hashed at each check)."""
    package = root / "pkg"
    package.mkdir()
    source = package / "mod.py"
    source.write_text("X = 1\n")
    if compiled:
        (package / "mod.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    if manifest:
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        recorded: dict[str, object] = {"modules": {"pkg/mod.py": digest}}
        if stats:
            recorded["stats"] = {"pkg/mod.py": [source.stat().st_size,
                                                source.stat().st_mtime_ns]}
        (package / MANIFEST.name).write_text(json.dumps(recorded))
    return package


def test_pure_python_passes(tmp_path: Path) -> None:
    assert check(_package(tmp_path, compiled=False, manifest=False)) == 0


def test_up_to_date_build_passes(tmp_path: Path) -> None:
    assert check(_package(tmp_path, compiled=True, manifest=True)) == 1


def test_edited_source_is_refused(tmp_path: Path) -> None:
    package = _package(tmp_path, compiled=True, manifest=True)
    (package / "mod.py").write_text("X = 2\n")
    with pytest.raises(StaleNativeBuild, match=r"pkg/mod\.py changed after it was compiled"):
        check(package)


def test_deleted_source_is_refused(tmp_path: Path) -> None:
    package = _package(tmp_path, compiled=True, manifest=True)
    (package / "mod.py").unlink()
    with pytest.raises(StaleNativeBuild, match=r"pkg/mod\.py"):
        check(package)


def test_a_source_whose_stat_is_recorded_is_not_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up check stats the sources and hashes only those whose stat changed."""
    package = _package(tmp_path, compiled=True, manifest=True, stats=True)

    def no_hashing(data: bytes) -> object:
        raise AssertionError("hashed")

    monkeypatch.setattr(native.hashlib, "sha256", no_hashing)
    assert check(package) == 1


def test_an_edit_of_the_same_size_is_refused(tmp_path: Path) -> None:
    """Its mtime differs from the recorded one, so the source is hashed."""
    package = _package(tmp_path, compiled=True, manifest=True, stats=True)
    source = package / "mod.py"
    mtime = source.stat().st_mtime_ns
    source.write_text("X = 2\n")
    os.utime(source, ns=(mtime + 1_000_000, mtime + 1_000_000))  # a coarse clock's same tick
    with pytest.raises(StaleNativeBuild, match=r"pkg/mod\.py changed after it was compiled"):
        check(package)


def test_a_touched_but_unchanged_source_passes(tmp_path: Path) -> None:
    package = _package(tmp_path, compiled=True, manifest=True, stats=True)
    os.utime(package / "mod.py", ns=(1, 1))
    assert check(package) == 1


def test_interrupted_build_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StaleNativeBuild, match="interrupted build"):
        check(_package(tmp_path, compiled=True, manifest=False))


def test_every_listed_module_runs_compiled() -> None:
    """`make install` (so `make run` and `make test`) builds the native modules: the suite
    tests the compiled broker, and each listed module must load as an extension."""
    assert MANIFEST.exists(), "no native build: run `python tools/build_native.py`"
    modules = json.loads(MANIFEST.read_text())["modules"]
    for path in modules:
        name = path.removesuffix(".py").replace("/", ".")
        loaded = importlib.import_module(name).__file__
        assert loaded is not None and loaded.endswith(".so"), (name, loaded)
