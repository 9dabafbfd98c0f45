"""Refuses compiled modules whose source changed after they were compiled.

`tools/build_native.py` compiles the hot path with mypyc into extension modules that sit
next to their `.py` files and shadow them. Edit a compiled module and forget to rebuild, and
the old code would run without a word: the worst kind of bug to chase. So the build records
each source's SHA-256 in `broker/native.json`, and importing `broker` checks it.

The check is on every start's path (issue 42: the first CONNACK within 0.2 s), so it reads
no source it need not: the build also records each source's size and mtime, and a source
whose `stat` still shows both is the one compiled (an edit, a checkout or a copy without
`-p` changes its mtime). Only a source whose stat differs is hashed: refused if its content
changed, accepted if it was only touched. A tree with a manifest is not walked for `.so`
files either: the build writes the manifest last and `clean` removes it first, so a tree
without one is the only place an interrupted build can hide.
"""

import hashlib
import json
import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
MANIFEST = _PACKAGE / "native.json"
_FIX = "run `python tools/build_native.py` (or `... clean` to run pure Python)"


class StaleNativeBuild(ImportError):
    pass


def compiled_modules(package: Path = _PACKAGE) -> list[Path]:
    return sorted(package.rglob("*.so"))


def check(package: Path = _PACKAGE) -> int:
    """Raises StaleNativeBuild if any compiled module may be out of date; returns how many
    modules are compiled (0: pure Python)."""
    manifest = package / MANIFEST.name
    try:
        recorded = json.loads(manifest.read_bytes())
    except FileNotFoundError:
        if compiled_modules(package):
            raise StaleNativeBuild(f"compiled modules in {package} but no {manifest.name}"
                                   f" (an interrupted build): {_FIX}") from None
        return 0
    modules: dict[str, str] = recorded["modules"]
    stats: dict[str, list[int]] = recorded.get("stats", {})
    for path, digest in modules.items():
        source = package.parent / path
        try:
            stat = os.stat(source)
            if stats.get(path) == [stat.st_size, stat.st_mtime_ns]:  # as build_native.py
                continue
            if hashlib.sha256(source.read_bytes()).hexdigest() == digest:
                continue
        except FileNotFoundError:
            pass
        raise StaleNativeBuild(f"{path} changed after it was compiled: {_FIX}")
    return len(modules)
