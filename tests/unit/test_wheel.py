"""The deadline wheel on a real event loop: owners are told once their time has come, at
most a slot late, in order; discarded ones never; and one may file itself again."""

import asyncio

from broker.server.wheel import RESOLUTION, wheel

_TOLERANCE = 0.5  # the loop's own lateness on a busy machine, beyond the slot


class Owner:
    def __init__(self, name: str, log: list[tuple[str, float]], done: asyncio.Event,
                 again: float | None = None) -> None:
        self.name, self.log, self.done, self.again = name, log, done, again

    def timer_due(self) -> None:
        self.log.append((self.name, asyncio.get_running_loop().time()))
        if self.again is not None:
            wheel().add(self, self.again)
            self.again = None
        elif self.name == "last":
            self.done.set()


async def test_owners_are_told_in_order_once_due_and_a_discarded_one_never() -> None:
    loop = asyncio.get_running_loop()
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    start = loop.time()
    # "late" first: the timer, armed for it, must be re-armed for each earlier one.
    delays = {"late": 1.5, "early": 0.1, "gone": 0.3, "middle": 0.35, "last": 1.6}
    owners = {name: Owner(name, log, done) for name in delays}
    slots = {name: wheel().add(owners[name], delay) for name, delay in delays.items()}
    wheel().discard(owners["gone"], slots["gone"])
    await asyncio.wait_for(done.wait(), 5)
    assert [name for name, _ in log] == ["early", "middle", "late", "last"]
    for name, at in log:
        assert delays[name] - 1e-3 <= at - start <= delays[name] + RESOLUTION + _TOLERANCE


async def test_an_owner_may_file_itself_again_from_its_callback() -> None:
    log: list[tuple[str, float]] = []
    done = asyncio.Event()
    start = asyncio.get_running_loop().time()
    wheel().add(Owner("last", log, done, again=0.3), 0.05)
    await asyncio.wait_for(done.wait(), 5)
    assert [name for name, _ in log] == ["last", "last"]
    assert log[1][1] - start >= 0.35 - 1e-3
