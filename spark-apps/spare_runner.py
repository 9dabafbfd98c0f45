"""A pre-imported spare Python process for the mqtt-ds streaming source's runner.

    python -S spare_runner.py MODULE [PRELOAD ...]   (as python-installed-pyspark runs it)

Spark starts a new Python process for each streaming query's source (the JVM's
PythonStreamingSourceRunner runs `python -m pyspark.sql.streaming.python_streaming_source_runner`
as a simple worker, never through pyspark.daemon), and that process spends ~0.5 CPU-s
importing pyspark, pyarrow, numpy and this source before the query's first call: more than
the rest of a streaming query's fixed cost in a warm session. So:

- the first runner of a JVM finds no spare: it imports MODULE and PRELOAD, forks the spare
  off itself (nothing is imported twice) and runs its own query;
- the spare listens on a Unix socket in the JVM's local dir (Spark's SPARK_LOCAL_DIRS for
  the runner: private to the application and deleted with it) and forks a child for each
  later runner; the child takes over the caller's stdin, stdout, stderr, environment and
  working directory and runs MODULE as `__main__`: a fork instead of the imports;
- the caller stays the process Spark started and manages: it passes SIGTERM on to the child
  and exits with the child's status, so Spark's stop works as before (the runner also exits
  when the JVM closes its socket).

The spare exits with the JVM (a pidfd on it) or with the job's process group; it answers
only the same user (SO_PEERCRED). Without a local dir, a pidfd or a socket path that fits,
each runner simply runs as before. Imports here are the standard library's only: the
caller pays for nothing else.
"""

import contextlib
import hashlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Mapping

_INT = struct.Struct("!i")
_FDS = 3  # stdin, stdout, stderr
_REQUEST_TIMEOUT_S = 10.0
_KILLED = 1  # the caller's status when the child died without one (a signal)


def address(modules: list[str], env: Mapping[str, str]) -> str | None:
    """The spare's socket for this JVM (its first local dir), Python, path and modules;
    None when Spark named no local dir."""
    local = env.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    if not local:
        return None
    key = "\0".join([sys.executable, env.get("PYTHONPATH", ""), *modules])
    return os.path.join(local, f"spare-{hashlib.sha256(key.encode()).hexdigest()[:16]}.sock")


def ask(path: str) -> int | None:
    """Runs the spare's module in a child of the spare at `path`, as this process would:
    the child's exit status, or None if no spare answered (nothing ran)."""
    # A SIGTERM before the child is known waits, then goes to the child (or to this
    # process, if nothing runs).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with conn:
        try:
            conn.connect(path)
            request = json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}).encode()
            socket.send_fds(conn, [request[:1]], [0, 1, 2])
            conn.sendall(request[1:])
            conn.shutdown(socket.SHUT_WR)
            pid = _read_int(conn)
        except OSError:
            pid = None
        if pid is not None:
            signal.signal(signal.SIGTERM, lambda *_: _kill(pid))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        if pid is None:
            return None
        status = _read_int(conn)
        return _KILLED if status is None else status


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def _read_int(conn: socket.socket) -> int | None:
    data = b""
    while len(data) < _INT.size:
        chunk = conn.recv(_INT.size - len(data))
        if not chunk:
            return None
        data += chunk
    return int(_INT.unpack(data)[0])


def run(module: str) -> int:
    """`python -m module` in this process; its exit status. The module runs afresh as
    `__main__` (what it imports is imported already)."""
    sys.modules.pop(module, None)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def listen(path: str) -> socket.socket | None:
    """The spare's socket, None if it cannot have one (another runner got there first, or
    the path is too long for a Unix socket). A socket file nobody listens on is stale (its
    spare died): it is replaced."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if os.path.exists(path):
            os.unlink(path)
        listener.bind(path)
        listener.listen(8)
    except OSError:
        listener.close()
        return None
    return listener


def serve(listener: socket.socket, jvm: int, module: str) -> None:
    """The spare's loop: a child per request, until the JVM exits. Children are reaped
    as they exit, so their CPU time is the spare's children's (as a process tree counts
    it) and no zombie is left."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in range(_FDS):  # the first runner's pipes to the JVM are not the spare's
        os.dup2(devnull, fd)
    os.close(devnull)
    exited, wakeup = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below
    with listener:
        while True:
            ready, _, _ = select.select([listener, jvm, exited], [], [])
            if jvm in ready:
                return
            if exited in ready:
                _reap(exited)
                continue
            conn, _ = listener.accept()
            with conn:
                request = _request(conn)
                if request is not None and os.fork() == 0:
                    listener.close()
                    os.close(jvm)
                    _child(conn, *request, module)
                if request is not None:
                    for fd in request[0]:
                        os.close(fd)


def _reap(exited: int) -> None:
    with contextlib.suppress(BlockingIOError):
        os.read(exited, 512)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _request(conn: socket.socket) -> tuple[list[int], dict[str, str], str] | None:
    """The caller's fds, environment and working directory; None (and nothing kept) if
    it is another user's or malformed."""
    conn.settimeout(_REQUEST_TIMEOUT_S)
    fds: list[int] = []
    try:
        peer = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", peer)[1] != os.getuid():
            return None
        first, fds, _, _ = socket.recv_fds(conn, 1, _FDS)
        body = [first]
        while chunk := conn.recv(1 << 16):
            body.append(chunk)
        request = json.loads(b"".join(body))
        if len(fds) == _FDS:
            return fds, dict(request["env"]), str(request["cwd"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for fd in fds:
        os.close(fd)
    return None


def _child(conn: socket.socket, fds: list[int], env: dict[str, str], cwd: str,
           module: str) -> None:
    """A forked child of the spare: becomes the caller's runner, never returns."""
    status = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        conn.settimeout(None)
        conn.sendall(_INT.pack(os.getpid()))
        status = run(module)
        conn.sendall(_INT.pack(status))
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(status)


def main(argv: list[str]) -> int:
    module, preload = argv[0], argv[1:]
    path = address([module, *preload], os.environ)
    if path is not None:
        status = ask(path)
        if status is not None:
            return status
    import site  # run with -S, so that a caller pays for no site-packages set-up

    site.main()
    for name in (module, *preload):
        importlib.import_module(name)
    listener = listen(path) if path is not None else None
    if listener is not None:
        try:
            jvm = os.pidfd_open(os.getppid())
        except OSError:
            jvm = None
        if jvm is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                try:
                    serve(listener, jvm, module)
                finally:
                    os._exit(0)
            os.close(jvm)
        listener.close()
    return run(module)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
