"""The in-memory view of one group's log: the entries after its snapshot, and the
configurations they carry.

Entries up to `snapshot_index` live in the state machine (its data is flushed up to there) and
are dropped here, so a compacted group holds no payloads it no longer needs. Configuration
entries take effect when appended, so the log also answers "which configuration holds at the
end of the log" and "at index i" (what a snapshot at i carries), and forgets the
configurations of entries that a new leader truncates.
"""

from broker.raft.messages import CONFIG, EMPTY_CONFIG, Config, Entry


class RaftLog:
    __slots__ = ("_configs", "entries", "snapshot_config", "snapshot_index", "snapshot_term")

    def __init__(self, snapshot_index: int = 0, snapshot_term: int = 0,
                 snapshot_config: Config = EMPTY_CONFIG) -> None:
        self.snapshot_index = snapshot_index
        self.snapshot_term = snapshot_term
        self.snapshot_config = snapshot_config
        self.entries: list[Entry] = []  # entries[i].index == snapshot_index + 1 + i
        self._configs: list[tuple[int, Config]] = []  # configurations of entries, by index

    @property
    def last_index(self) -> int:
        return self.snapshot_index + len(self.entries)

    @property
    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.snapshot_term

    @property
    def config(self) -> Config:
        return self._configs[-1][1] if self._configs else self.snapshot_config

    def config_at(self, index: int) -> Config:
        for at, config in reversed(self._configs):
            if at <= index:
                return config
        return self.snapshot_config

    def pending_config_index(self) -> int:
        """The index of the newest configuration entry (0 if it is in the snapshot)."""
        return self._configs[-1][0] if self._configs else 0

    def term_at(self, index: int) -> int | None:
        """The term of the entry at `index`; None when compacted away or beyond the end."""
        offset = index - self.snapshot_index
        if offset == 0:
            return self.snapshot_term
        if 0 < offset <= len(self.entries):
            return self.entries[offset - 1].term
        return None

    def slice(self, first: int, max_bytes: int) -> list[Entry]:
        """Entries from `first` on, at least one (when there is one), then up to `max_bytes`
        of data."""
        start = first - self.snapshot_index - 1
        entries = self.entries
        end = start
        size = 0
        stop = len(entries)
        while end < stop:
            size += len(entries[end].data)
            end += 1
            if size >= max_bytes:
                break
        return entries[start:end]

    def entries_between(self, first: int, last: int) -> list[Entry]:
        base = self.snapshot_index + 1
        return self.entries[first - base:last - base + 1]

    def append(self, entry: Entry) -> None:
        self.entries.append(entry)
        if entry.kind == CONFIG:
            self._configs.append((entry.index, Config.decode(entry.data)))

    def truncate_after(self, index: int) -> None:
        """Drops the entries after `index` (a new leader's log disagrees with them)."""
        del self.entries[index - self.snapshot_index:]
        while self._configs and self._configs[-1][0] > index:
            self._configs.pop()

    def find_conflict_hint(self, index: int, term: int) -> int:
        """The largest index <= `index` whose term is <= `term`: where a leader whose entry
        at `index` has `term` should probe next (skips a whole diverging term at once)."""
        index = min(index, self.last_index)
        while index > self.snapshot_index:
            if self.entries[index - self.snapshot_index - 1].term <= term:
                return index
            index -= 1
        return index

    def compact(self, index: int) -> None:
        """Forgets the entries up to `index` (the state machine holds them)."""
        term = self.term_at(index)
        assert term is not None and index >= self.snapshot_index
        self.snapshot_config = self.config_at(index)
        del self.entries[:index - self.snapshot_index]
        self.snapshot_index = index
        self.snapshot_term = term
        self._configs = [item for item in self._configs if item[0] > index]

    def restore(self, index: int, term: int, config: Config) -> None:
        """Installs a snapshot: keeps the entries after it only when the log holds its last
        entry (Raft's InstallSnapshot rule), else starts empty after it."""
        if index < self.last_index and self.term_at(index) == term:
            self.compact(index)
            return
        self.entries = []
        self._configs = []
        self.snapshot_index = index
        self.snapshot_term = term
        self.snapshot_config = config
