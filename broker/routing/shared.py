"""Which member of a shared subscription group gets a message (`$share/group/filter`).

The members may sit on several nodes; the node where the message was published picks one,
so each message reaches the group once whatever its spread. Local members whose client is
offline are picked only when no member is online; members on other nodes count as online
(their node announces them only while subscribed). Strategies, as EMQX names them:

- `round_robin`: members in turn (per group and publishing node);
- `random`: any member, uniformly;
- `hash_clientid`: by the publisher's client ID, so one publisher's messages go to one member
  while the membership stays the same;
- `sticky`: the member picked last, as long as it stays a member and online;
- `local`: a member on this node when there is one (round robin among them), else any.
"""

import random
import zlib
from collections.abc import Callable
from typing import Final

STRATEGIES: Final = ("round_robin", "random", "hash_clientid", "sticky", "local")

Member = tuple[str, str | None]  # (client ID, site of its node; None = this node)
GroupKey = tuple[str, str]  # (group, filter)


class SharedDispatch:
    __slots__ = ("_random", "_sticky", "_turn", "strategy")

    def __init__(self, strategy: str = "round_robin", rng: random.Random | None = None) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown shared subscription strategy {strategy!r}")
        self.strategy = strategy
        self._random = rng or random.Random()
        self._turn: dict[GroupKey, int] = {}
        self._sticky: dict[GroupKey, Member] = {}

    def pick(self, key: GroupKey, members: list[Member], publisher: str,
             is_online: Callable[[str], bool]) -> Member:
        members.sort(key=lambda member: (member[0], member[1] or ""))
        online = [m for m in members if m[1] is not None or is_online(m[0])] or members
        strategy = self.strategy
        if strategy == "random":
            return self._random.choice(online)
        if strategy == "hash_clientid":
            return online[zlib.crc32(publisher.encode()) % len(online)]
        if strategy == "sticky":
            chosen = self._sticky.get(key)
            if chosen is None or chosen not in online:
                chosen = self._sticky[key] = self._random.choice(online)
            return chosen
        if strategy == "local":
            online = [m for m in online if m[1] is None] or online
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        return online[turn % len(online)]
