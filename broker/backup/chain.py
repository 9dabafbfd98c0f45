"""A full archive and the incremental ones made after it (`export --since`), restored as one:
which archive each generation comes from, or why the archives do not make a whole (pure).

An incremental archive holds the current state (sessions, retained messages, current
generations) and the generations sealed since its `since_us`; its manifest lists every
generation live at its cut, those it leaves out with `in_archive` false. Restored after the
archives before it, oldest first, the last one gives the current state and each sealed
generation comes from the latest archive holding it sealed, with the same `sealed_at` (a
generation an earlier archive holds only as its then current one, unsealed, is not the
generation the later cut saw sealed: its later messages would be missing). A generation
found in none, an archive out of order, one made since a time after the archive before it
was made (what was sealed in between is in neither) or a second full archive is refused,
naming the archive and the generation.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from broker.backup.manifest import Generation, Manifest


class BadChain(ValueError):
    """The archives given do not restore one whole state: says which and why."""


@dataclass(frozen=True, slots=True)
class Plan:
    """`take[i]`: the generation paths (manifest.Generation.path) to restore from archive i;
    the last archive's sessions, retained messages and current generations besides."""

    take: tuple[frozenset[str], ...]

    @property
    def last(self) -> int:
        return len(self.take) - 1


def _time(manifest: Manifest) -> str:
    return f"{manifest.created} ({manifest.created_us} µs)"


def _follows(names: Sequence[str], manifests: Sequence[Manifest], i: int) -> None:
    before, this = manifests[i - 1], manifests[i]
    if this.since_us is None:
        raise BadChain(f"{names[i]} is a full archive: a full archive restores alone (give it"
                       f" without {names[0]})")
    if this.n_shards != before.n_shards:
        raise BadChain(f"{names[i]} has {this.n_shards} shards, {names[i - 1]}"
                       f" {before.n_shards}: not archives of one cluster")
    if this.created_us <= before.created_us:
        raise BadChain(f"{names[i]} was made at {_time(this)}, not after {names[i - 1]}"
                       f" ({_time(before)}): give the archives oldest first")


def _no_gap(names: Sequence[str], manifests: Sequence[Manifest], i: int) -> None:
    before, this = manifests[i - 1], manifests[i]
    assert this.since_us is not None  # (_follows)
    if this.since_us > before.created_us:
        raise BadChain(f"{names[i]} holds what was sealed since {this.since_us} µs, after"
                       f" {names[i - 1]} was made ({_time(before)}): generations sealed in"
                       f" between are in neither (an increment is missing?)")


def _source(names: Sequence[str], manifests: Sequence[Manifest], wanted: Generation) -> int:
    """The latest archive before the last holding `wanted` as the last cut saw it."""
    for i in range(len(manifests) - 2, -1, -1):
        for held in manifests[i].generations:
            if (held.path == wanted.path and held.in_archive
                    and held.sealed_at == wanted.sealed_at):
                return i
    raise BadChain(f"{wanted.path} (sealed at {wanted.sealed_at} µs), which {names[-1]} leaves"
                   f" to an earlier archive, is sealed in none of {', '.join(names[:-1])}:"
                   f" an increment between them is missing")


def plan(names: Sequence[str], manifests: Sequence[Manifest]) -> Plan:
    """Where each generation of the last cut comes from; raises BadChain. `names`: how the
    caller names each archive (its file), for the reasons."""
    if not manifests:
        raise BadChain("no archive given")
    if manifests[0].since_us is not None:
        which = "incremental" if len(manifests) == 1 else "the first one is incremental"
        raise BadChain(f"{names[0]}: {which} (--since {manifests[0].since_us} µs): it holds"
                       f" only what was sealed after an earlier archive: give the full"
                       f" archive it follows, then the increments, oldest first")
    for i in range(1, len(manifests)):  # all in order first: a gap may be a wrong order
        _follows(names, manifests, i)
    for i in range(1, len(manifests)):
        _no_gap(names, manifests, i)
    take: list[set[str]] = [set() for _ in manifests]
    for generation in manifests[-1].generations:
        source = (len(manifests) - 1 if generation.in_archive
                  else _source(names, manifests, generation))
        take[source].add(generation.path)
    return Plan(tuple(frozenset(paths) for paths in take))
