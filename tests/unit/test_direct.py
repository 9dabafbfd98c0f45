"""DirectFile (broker/direct.py): what goes in comes out, whatever the sizes and
however it is filled, with the tail past the last whole block; on an error the file is
left for the caller to remove."""

import fcntl
import os
from pathlib import Path

import pytest

from broker.direct import DirectFile

BUFFER = 64 << 10


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, BUFFER, BUFFER + 5, 3 * BUFFER + 4097])
def test_what_is_written_is_read_back(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "archive.tar"
    with DirectFile(path, buffer=BUFFER) as file:
        file.write(data[:size // 3])  # a copy into the buffer, then filled in place
        rest = memoryview(data)[size // 3:]
        while rest:
            space = file.space()
            take = min(len(space), len(rest), 10007)
            space[:take] = rest[:take]
            file.commit(take)
            rest = rest[take:]
        assert file.bytes == size
    assert path.read_bytes() == data


def test_close_twice_and_an_error_leaves_the_file_closed(tmp_path: Path) -> None:
    path = tmp_path / "a"
    file = DirectFile(path, buffer=BUFFER)
    file.write(b"x" * 5000)
    file.close()
    file.close()
    assert path.read_bytes() == b"x" * 5000
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(RuntimeError), DirectFile(tmp_path / "b", buffer=BUFFER) as failing:
        failing.write(b"y" * (BUFFER + 1))
        raise RuntimeError("the source failed")
    assert len(os.listdir("/proc/self/fd")) == fds
    assert (tmp_path / "b").stat().st_size == BUFFER  # the whole buffer went out; the tail not


def test_a_file_smaller_than_the_buffer_goes_past_the_page_cache_but_its_tail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An import's sealed tables (about 2 MiB) never fill the 4 MiB buffer: its whole
    blocks must still be written with O_DIRECT, only the last partial block without."""
    writes: list[tuple[int, bool]] = []
    real_write = os.write

    def write(fd: int, data: memoryview) -> int:
        writes.append((len(data), bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    data = os.urandom(BUFFER + 3 * 4096 + 100)
    path = tmp_path / "table.ldb"
    with DirectFile(path, sync=False, buffer=BUFFER) as file:
        file.write(data)
        if not file.direct:
            pytest.skip("this file system refuses O_DIRECT")
    assert path.read_bytes() == data
    assert [(length, direct) for length, direct in writes if length] == [
        (BUFFER, True), (3 * 4096, True), (100, False)]
