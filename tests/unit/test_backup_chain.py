"""A full archive and its increments as one restore (broker/backup/chain.py, pure): where each
generation comes from, and the chains refused with their reason."""

import dataclasses

import pytest

from broker.backup.chain import BadChain, plan
from broker.backup.manifest import Generation, Manifest

NAMES = ("base.tar", "inc1.tar", "inc2.tar")


def made(created: int, since: int | None, *generations: Generation,
         n_shards: int = 1) -> Manifest:
    return Manifest("0.2.0", "2026-12-06T12:00:00Z", created, since, {"n_shards": n_shards},
                    {}, {}, generations, ())


def gen(number: int, sealed_at: int | None, in_archive: bool = True) -> Generation:
    return Generation(0, number, number * 10, sealed_at, sealed_at is not None, in_archive)


# base: 1 sealed, 2 current. inc1 (since base): 1 left to base, 2 sealed since, 3 current.
# inc2 (since inc1): 1 and 2 left to the archives before, 3 sealed since, 4 current.
BASE = made(100, None, gen(1, 50), gen(2, None))
INC1 = made(200, 100, gen(1, 50, False), gen(2, 150), gen(3, None))
INC2 = made(300, 200, gen(1, 50, False), gen(2, 150, False), gen(3, 250), gen(4, None))


def test_each_generation_comes_from_the_latest_archive_holding_it_sealed() -> None:
    assert plan(NAMES, [BASE, INC1, INC2]).take == (
        frozenset({gen(1, 50).path}), frozenset({gen(2, 150).path}),
        frozenset({gen(3, 250).path, gen(4, None).path}))
    assert plan(NAMES[:1], [BASE]).take == (frozenset({gen(1, 50).path, gen(2, None).path}),)


@pytest.mark.parametrize(("manifests", "names", "reason"), [
    ([INC1], ("inc1.tar",), "inc1.tar: incremental"),
    ([INC1, INC2], ("inc1.tar", "inc2.tar"), "the first one is incremental"),
    ([BASE, INC2, INC1], ("base.tar", "inc2.tar", "inc1.tar"),
     r"inc1.tar was made at .* \(200 µs\), not after inc2.tar .*oldest first"),
    ([BASE, BASE], ("base.tar", "again.tar"), "again.tar is a full archive"),
    ([BASE, INC2], ("base.tar", "inc2.tar"), "after base.tar was made"),
    ([BASE, made(200, 100, gen(1, 50, False), gen(2, None), n_shards=2)],
     ("base.tar", "inc1.tar"), "inc1.tar has 2 shards, base.tar 1"),
])
def test_chains_that_do_not_make_a_whole_are_refused(
        manifests: list[Manifest], names: tuple[str, ...], reason: str) -> None:
    with pytest.raises(BadChain, match=reason):
        plan(names, manifests)


def test_a_generation_an_earlier_archive_holds_only_unsealed_is_missing() -> None:
    """inc1 made without generation 2 (sealed since the base, which holds it current): the
    base's copy lacks what came after its cut."""
    without = dataclasses.replace(INC1, generations=(gen(1, 50, False), gen(2, 150, False),
                                                     gen(3, None)))
    with pytest.raises(BadChain, match=r"gen-000002 \(sealed at 150 µs\), which inc1.tar"
                                       r" leaves to an earlier archive, is sealed in none"):
        plan(NAMES[:2], [BASE, without])
