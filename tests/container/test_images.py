"""The images as users run them: the broker with its data on a volume, reached with
mosquitto_pub/sub through published (loopback) ports, killed with SIGKILL and started again
on the same volume; then the Spark image's job over a copy of a generation it sealed."""

import base64
import json
import shutil
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.container.engine import (
    BROKER_IMAGE,
    SPARK_IMAGE,
    Containers,
    Engine,
    containers,
    wait_http,
)

MESSAGES = 300
TOPIC = "fleet/truck7/gps"

pytestmark = pytest.mark.timeout(600)


def start_broker(box: Containers, name: str, volume: str) -> tuple[int, int]:
    """The image's default command on the volume; (MQTT port, HTTP port) once it answers."""
    box.run(name, BROKER_IMAGE, ports=(1883, 18083), options=("-v", f"{volume}:/data"))
    mqtt, http = box.port(name, 1883), box.port(name, 18083)
    try:
        wait_http(f"http://127.0.0.1:{http}/status")
    except OSError as error:
        raise AssertionError(f"broker never answered: {error}\n{box.logs(name)}") from error
    return mqtt, http


def mosquitto(tool: str, port: int, *args: str, stdin: str | None = None,
              timeout: float = 60) -> str:
    done = subprocess.run([tool, "-h", "127.0.0.1", "-p", str(port), "-V", "mqttv5", *args],
                          input=stdin, text=True, capture_output=True, timeout=timeout,
                          check=False)
    assert done.returncode == 0, f"{tool} {args}: {done.returncode}\n{done.stderr}"
    return done.stdout


def test_durable_session_survives_kill_9_of_the_container_and_spark_reads_its_data(
        engine: Engine, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    with containers(engine) as box:
        volume = box.volume(f"mqtt-data-{run}")
        first = f"mqtt-a-{run}"
        mqtt, _ = start_broker(box, first, volume)
        # The seed's quick start: subscribe with a durable session, leave, publish QoS 1.
        durable = ("-i", "fleet-app", "-c", "-x", "3600", "-q", "1", "-t", "fleet/#")
        mosquitto("mosquitto_sub", mqtt, *durable, "-E")
        lines = "".join(f"msg {i}\n" for i in range(MESSAGES))
        mosquitto("mosquitto_pub", mqtt, "-i", "truck7", "-q", "1", "-t", TOPIC, "-l",
                  stdin=lines)
        engine("kill", "-s", "KILL", first)
        box.remove(first)

        second = f"mqtt-b-{run}"
        mqtt, http = start_broker(box, second, volume)
        got = mosquitto("mosquitto_sub", mqtt, *durable, "-C", str(MESSAGES), "-W", "60",
                        timeout=90)
        assert got.splitlines() == [f"msg {i}" for i in range(MESSAGES)]

        # Seal the generation through the HTTP API (with the key the broker made on its
        # volume at first start), then give Spark a copy of the volume.
        key = engine("exec", second, "cat", "/data/api_key").stdout.strip()
        seal = urllib.request.Request(
            f"http://127.0.0.1:{http}/api/v5/ds/storages/messages/generations", method="POST",
            headers={"Authorization": "Basic " + base64.b64encode(key.encode()).decode()})
        with urllib.request.urlopen(seal, timeout=30) as response:
            assert json.loads(response.read())["sealed"] >= 1
        mountpoint = engine("volume", "inspect", "--format", "{{.Mountpoint}}",
                            volume).stdout.strip()
        copy, out = tmp_path / "data", tmp_path / "out"
        shutil.copytree(mountpoint, copy)
        out.mkdir(mode=0o777)
        out.chmod(0o777)  # the Spark image's user writes here
        job = f"spark-{run}"
        box.started.append(job)
        done = engine("run", "--name", job, "-v", f"{copy}:/data:ro", "-v", f"{out}:/out",
                      SPARK_IMAGE, "spark-submit", "--master", "local[1]",
                      "/opt/spark-apps/stats.py", "/data", "--output", "/out/stats",
                      "--format", "json", check=False, timeout=400)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for part in (out / "stats" / "by_topic").glob("part-*")
            for line in part.read_text().splitlines()]
    assert sum(row["messages"] for row in rows if row["topic"] == TOPIC) == MESSAGES
