"""The durable sessions this node owns that are out of memory, and when each must be looked
at again: its delayed will is due, or it expires.

An offline durable session needs nothing in memory to stay correct: its messages are
stored by the durable filter index (node.py), its state is in the `sessions` database, and
it is loaded when its client comes back. What must stay is that it exists here (a CONNECT
for its ID resumes it) and its next deadline. So per session: its client ID in a dict, and
that ID again in the set of the whole second of its deadline (rounded up, never early); a
heap orders the seconds. About 150 bytes a session with a client ID of 20 characters,
where a session object with its timers cost 3.6 KiB. Sans-I/O: the session manager arms a
timer for `next_due()` and asks for what is `due`.
"""

import heapq
import math


class OfflineSessions:
    __slots__ = ("_due", "_heap", "_seconds", "complete")

    def __init__(self) -> None:
        # client ID -> the second it is due (0: never, until its client comes back).
        self._due: dict[str, int] = {}
        self._seconds: dict[int, set[str]] = {}
        self._heap: list[int] = []
        # False while the start-up scan of the stored sessions runs: an ID not here yet
        # may still be on disk (SessionManager looks there then).
        self.complete = True

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._due

    def add(self, client_id: str, deadline: float | None) -> None:
        """The session is out of memory until its client is back or `deadline` (wall clock
        seconds; None: none)."""
        self.discard(client_id)
        second = math.ceil(deadline) if deadline is not None else 0
        self._due[client_id] = second
        if second:
            bucket = self._seconds.get(second)
            if bucket is None:
                bucket = self._seconds[second] = set()
                heapq.heappush(self._heap, second)
            bucket.add(client_id)

    def discard(self, client_id: str) -> bool:
        """The session is loaded again (or gone); True if it was here."""
        second = self._due.pop(client_id, None)
        if second is None:
            return False
        if second:
            bucket = self._seconds.get(second)
            if bucket is not None:
                bucket.discard(client_id)
                if not bucket:
                    del self._seconds[second]  # its heap entry goes when it comes up
        return True

    def next_due(self) -> int | None:
        """The earliest second a session is due, if any."""
        heap = self._heap
        while heap and heap[0] not in self._seconds:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def due(self, now: float) -> list[str]:
        """Takes the sessions due by `now` out of the index (the caller loads them)."""
        found: list[str] = []
        heap = self._heap
        while heap and heap[0] <= now:
            second = heapq.heappop(heap)
            bucket = self._seconds.pop(second, None)
            if bucket:
                for client_id in bucket:
                    del self._due[client_id]
                found.extend(bucket)
        return found

    def ids(self) -> list[str]:
        return list(self._due)
