"""Refuses compiled modules whose source changed after they were compiled.

`tools/build_native.py` compiles the hot path with mypyc into extension modules that sit
next to their `.py` files and shadow them. Edit a compiled module and forget to rebuild, and
the old code would run without a word: the worst kind of bug to chase. So the build records
each source's SHA-256 in `broker/native.json`, and importing `broker` checks it (~1 ms).
"""

import hashlib
import json
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
    if not compiled_modules(package):
        return 0
    manifest = package / MANIFEST.name
    if not manifest.exists():
        raise StaleNativeBuild(
            f"compiled modules in {package} but no {manifest.name} (an interrupted build): {_FIX}"
        )
    modules: dict[str, str] = json.loads(manifest.read_text())["modules"]
    for path, digest in modules.items():
        source = package.parent / path
        if not source.exists() or hashlib.sha256(source.read_bytes()).hexdigest() != digest:
            raise StaleNativeBuild(f"{path} changed after it was compiled: {_FIX}")
    return len(modules)
