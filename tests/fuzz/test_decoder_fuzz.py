"""The decoder fuzz target (fuzz/decoder.py): a short seeded run, and proof that its checks
fire, under the seeded mutator here and under atheris as `make fuzz` runs it."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fuzz.decoder
from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import MQTT_5
from broker.mqtt.constants import PropertyId as P
from broker.mqtt.packets import Packet, Publish
from broker.mqtt.record import replaced
from fuzz.decoder import Finding, check, header, mutator

SEED = 20261124
PINGREQ = b"\xc0\x00"


def findings_of(runs: int) -> list[str]:
    found: list[str] = []
    mutator(SEED, runs, lambda data, trace: found.append(f"{data.hex()}\n{trace}"))
    return found


def test_seeded_mutator_run_finds_nothing() -> None:
    assert findings_of(1_500) == []


class _CrashesOnPing:
    """A decoder with a bug: an IndexError for PINGREQ instead of a packet."""

    def __init__(self, **options: Any) -> None:
        self.decoder = Decoder(**options)

    def feed(self, data: bytes) -> list[Packet]:
        if PINGREQ in data:
            raise IndexError("injected decoder bug")
        return self.decoder.feed(data)


def test_an_exception_other_than_mqtt_error_is_a_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fuzz.decoder, "Decoder", _CrashesOnPing)
    with pytest.raises(IndexError):
        check(header(MQTT_5) + PINGREQ)
    assert any("injected decoder bug" in finding for finding in findings_of(300))


def test_a_lossy_round_trip_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    """An encoder that dropped properties would lose a retained message's or a will's."""
    def lossy(packet: Packet, version: int) -> bytes:
        if isinstance(packet, Publish):
            packet = replaced(packet, properties={})
        return encode(packet, version)

    monkeypatch.setattr(fuzz.decoder, "encode", lossy)
    wire = encode(Publish("t", b"x", properties={P.CONTENT_TYPE: "text/plain"}), MQTT_5)
    with pytest.raises(Finding, match="round trip gave"):
        check(header(MQTT_5) + wire)


def run_atheris(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fuzz.decoder", "--seed", str(SEED), "--work", str(tmp_path),
         *options],
        capture_output=True, text=True, timeout=300, check=False,
        cwd=Path(fuzz.decoder.__file__).parent.parent,
    )


def test_atheris_target_runs(tmp_path: Path) -> None:
    done = run_atheris(tmp_path, "--runs", "3000")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Done 3000 runs" in done.stderr
    assert any(tmp_path.glob("corpus/seed-*"))
