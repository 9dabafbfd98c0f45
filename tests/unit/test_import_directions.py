"""The import directions the documentation promises, checked on the source.

README's layout says `broker/mqtt` imports nothing else of the broker (a sans-I/O codec the
fuzzers, the tests and the Spark jobs can load alone); `broker/ds/__init__.py` says Durable
Storage imports nothing about connections, sessions or routing (so it can be replicated and
read by Spark without them); docs/operator-contract.md says the operator never imports broker
code (the contract document is the whole interface). Every import statement counts, those in
functions and under TYPE_CHECKING too: a lazy import is still a dependency.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _package(path: Path) -> str:
    """The package a file's relative imports start from: `broker/ds/shard.py` -> `broker.ds`
    (the operator's package lives in operator/)."""
    base = ROOT / "operator" if path.is_relative_to(ROOT / "operator") else ROOT
    return ".".join(path.relative_to(base).parent.parts)


def _imports(source: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in `source`, relative ones resolved."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                name = ".".join([*anchor, name] if name else anchor)
            yield node.lineno, name


def _violations(folder: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()
                ) -> list[str]:
    found = []
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}"
    for path in files:
        for line, name in _imports(path.read_text(), _package(path)):
            if any(name == a or name.startswith(a + ".") for a in allowed):
                continue
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


@pytest.mark.parametrize(("folder", "forbidden", "allowed"), [
    # README, Layout: "sans-I/O codec ... (imports nothing else)".
    ("broker/mqtt", ("broker",), ("broker.mqtt",)),
    # broker/ds/__init__.py: "nothing about connections, sessions or routing".
    ("broker/ds", ("broker.server", "broker.session", "broker.routing"), ()),
    # docs/operator-contract.md: "The operator never imports broker code".
    ("operator/mqtt_operator", ("broker",), ()),
    # broker/session/session.py: the packet handlers call Session's hooks and never know
    # which kind of session they hold (time slicing is shared, not durable logic).
    ("broker/server/handlers", ("broker.session.durable",), ("broker.session.durable.turn",)),
    # broker/http/common.py: the route modules share it and never import api.py, which
    # assembles them.
    ("broker/http", ("broker.http.api",), ()),
    # broker/backup/__init__.py: backups read and write the stores; the HTTP routes and the
    # CLI above them call it, and what it needs of the Raft groups is a Protocol of its own.
    ("broker/backup", ("broker.server", "broker.http", "broker.cluster", "broker.node",
                       "broker.ctl"), ()),
    # broker/cluster/routing.py and takeover.py: what they need of the node is a Protocol
    # of theirs; the node, above them, assembles the cluster.
    ("broker/cluster", ("broker.node",), ()),
])
def test_import_direction(folder: str, forbidden: tuple[str, ...],
                          allowed: tuple[str, ...]) -> None:
    assert _violations(folder, forbidden, allowed) == []


def test_the_check_sees_relative_and_lazy_imports() -> None:
    """The scan itself: a relative import resolves against its package, and an import
    inside a function is found like one at the top."""
    source = "def f():\n    from ..server import app\n    import broker.session\n"
    assert [n for _, n in _imports(source, "broker.mqtt")] == ["broker.server", "broker.session"]
    assert _package(ROOT / "broker" / "ds" / "shard.py") == "broker.ds"
    assert _package(ROOT / "operator" / "mqtt_operator" / "spec.py") == "mqtt_operator"
