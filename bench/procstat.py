"""Reads a process's memory and CPU use from /proc (Linux only).

Why from /proc and not psutil: the project venv must not gain dependencies for the benchmark,
and two fields of two files are all we need.
"""

import os

_TICKS = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """Resident set size (VmRSS) in KiB; `RssAnon` its anonymous part (the heap, not
    the pages of files read through mmap, such as LevelDB's tables)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def _stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            raw = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces: split after its closing parenthesis.
    return raw[raw.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time consumed so far by the process (all its threads)."""
    fields = _stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / _TICKS


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process and every descendant, those that exited and
    were waited for included (each process's cutime and cstime): a Spark session's JVM,
    its Python workers and the short-lived processes it starts per query. By parent pid
    from every /proc entry, because a JVM starts processes from any of its threads (and
    `children` lists only the main thread's)."""
    by_parent: dict[int, list[tuple[int, list[str]]]] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None:
            by_parent.setdefault(int(fields[1]), []).append((int(entry), fields))
    own = _stat(pid)
    total = 0 if own is None else sum(int(v) for v in own[11:15])
    pending = [pid]
    while pending:
        for child, fields in by_parent.get(pending.pop(), []):
            total += sum(int(v) for v in fields[11:15])
            pending.append(child)
    return total / _TICKS


def machine_busy_seconds() -> float:
    """CPU time spent busy by all CPUs so far (everything in /proc/stat but idle and iowait).

    The machine may be shared: the busy time not accounted to the broker or the generator is
    load from other processes, which the report shows next to each result.
    """
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / _TICKS


def children(pid: int) -> list[int]:
    """The process's direct children (of its main thread, which is what starts them)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(child) for child in listing.read().split()]
    except FileNotFoundError:
        return []


def command_name(pid: int) -> str:
    """The process's name (what `ps -o comm` shows); empty once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except FileNotFoundError:
        return ""
