"""A connection's ACL decisions: cached per action and topic, bounded, dropped with the file
that made them."""

from pathlib import Path

from broker.auth.acl import Access
from broker.auth.authorization import AclCache
from broker.auth.security import Security
from broker.config.loader import load_config


def _security(tmp_path: Path, acl: str, size: int = 2) -> Security:
    path = tmp_path / "acl"
    path.write_text(acl)
    return Security(load_config(None, [f"authorization.acl_file={path}",
                                       f"authorization.cache.max_size={size}"]))


def test_decisions_are_cached_per_action_and_bounded(tmp_path: Path) -> None:
    security = _security(tmp_path, "topic read r/#\ntopic write w/#\n")
    cache = AclCache(0)
    assert security.allows(cache, "c", None, "r/1", Access.READ)
    assert not security.allows(cache, "c", None, "r/1", Access.WRITE)
    assert cache.read == {"r/1": True} and cache.write == {"r/1": False}
    assert security.allows(cache, "c", None, "r/2", Access.READ)
    assert security.allows(cache, "c", None, "r/3", Access.READ)
    assert list(cache.read) == ["r/2", "r/3"]  # at most 2: the oldest went
    assert security.stats.denied == {"write": 1}
    assert not security.allows(cache, "c", None, "r/1", Access.WRITE)  # a cached refusal
    assert security.stats.denied == {"write": 2}  # still counted


def test_a_reloaded_file_empties_the_cache(tmp_path: Path) -> None:
    security = _security(tmp_path, "topic read r/#\n")
    cache = AclCache(security.generation)
    assert security.allows(cache, "c", None, "r/1", Access.READ)
    (tmp_path / "acl").write_text("topic read other/#\n")
    security.reload("test")
    assert cache.generation != security.generation
    assert not security.allows(cache, "c", None, "r/1", Access.READ)
    assert cache.read == {"r/1": False} and cache.generation == security.generation
