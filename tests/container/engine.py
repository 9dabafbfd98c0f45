"""The container engine the images are built with (tools/image/engine.sh: docker where its
daemon answers, else podman with the project's containers.conf), for tests that run them.

Every container and volume a test makes goes through one `Containers`, which removes them
all on exit, also when the test fails.
"""

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BROKER_IMAGE = "durable-mqtt-broker:dev"
SPARK_IMAGE = "durable-mqtt-spark:dev"


@dataclass(frozen=True)
class Engine:
    command: str
    env: dict[str, str]

    def __call__(self, *args: str, check: bool = True,
                 timeout: float = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([self.command, *args], env=self.env, text=True,
                                capture_output=True, timeout=timeout, check=False)
        if check and result.returncode:
            raise AssertionError(f"{self.command} {' '.join(args)} failed:\n{result.stderr}")
        return result


def detect(environment: dict[str, str]) -> Engine:
    script = 'source tools/image/engine.sh >/dev/null; echo "$ENGINE"; echo "${CONTAINERS_CONF:-}"'
    found = subprocess.run(["bash", "-c", script], cwd=ROOT, env=environment, text=True,
                           capture_output=True, timeout=600, check=True).stdout.split("\n")
    env = {**environment, "CONTAINERS_CONF": found[1]} if found[1] else dict(environment)
    return Engine(found[0], env)


def build_images(environment: dict[str, str]) -> str:
    """tools/image/build.sh: a no-op when the images are up to date (`make test` builds them
    before pytest runs, so this costs a hash of the sources)."""
    done = subprocess.run(["bash", "tools/image/build.sh"], cwd=ROOT, env=environment,
                          text=True, capture_output=True, timeout=3000, check=False)
    assert done.returncode == 0, f"image build failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@dataclass
class Containers:
    engine: Engine
    started: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)

    def volume(self, name: str) -> str:
        self.engine("volume", "create", name)
        self.volumes.append(name)
        return name

    def run(self, name: str, image: str, *args: str, ports: tuple[int, ...] = (),
            options: tuple[str, ...] = ()) -> str:
        """Starts a detached container; its ports are published on loopback only."""
        published = [f"-p127.0.0.1::{port}" for port in ports]
        self.started.append(name)
        self.engine("run", "-d", "--name", name, *published, *options, image, *args)
        return name

    def port(self, name: str, port: int) -> int:
        return int(self.engine("port", name, f"{port}/tcp").stdout.split(":")[-1])

    def remove(self, name: str) -> None:
        self.engine("rm", "-f", "-v", name, check=False)  # -v: its anonymous volumes too

    def logs(self, name: str) -> str:
        result = self.engine("logs", name, check=False)
        return result.stdout + result.stderr

    def close(self) -> None:
        for name in self.started:
            self.remove(name)
        for volume in self.volumes:
            self.engine("volume", "rm", "-f", volume, check=False)


@contextmanager
def containers(engine: Engine) -> Iterator[Containers]:
    made = Containers(engine)
    try:
        yield made
    finally:
        made.close()


def wait_http(url: str, timeout: float = 60.0) -> None:
    """Polls until the URL answers 200 (a container's server starting), with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)
