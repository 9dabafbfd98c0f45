"""DirectFile (broker/backup/direct.py): what goes in comes out, whatever the sizes and
however it is filled, with the tail past the last whole block; on an error the file is
left for the caller to remove."""

import os
from pathlib import Path

import pytest

from broker.backup.direct import DirectFile

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
