"""Fuzz target for the packet decoder: bytes in, packets or a clean MQTTError out.

`check(data)` is one input. Its first byte picks the decoder's state (a server before
CONNECT, or a connection already at 3.1, 3.1.1 or 5.0; a 96-byte maximum packet size or the
default), its second where to cut the rest in two feeds; the rest is the wire. A finding is:

- any exception from `Decoder.feed` other than an MQTTError (an IndexError, a TypeError
  from a compiled module's annotations, ...): on the broker that is a connection ended by
  an internal error instead of the reason code the client is owed;
- an MQTTError without the packets decoded before it, or a dead decoder that answers
  differently the next time;
- the two-feed decode disagreeing with the one-feed decode (packets or error class and
  reason code): a client's TCP segmentation must not change what the broker sees;
- a decoded packet that does not survive encode -> decode unchanged, or that the encoder
  refuses: the codec promises decode(encode(p)) == p for every packet a conforming peer
  may send (tests/unit/test_codec.py), and whatever the decoder accepts is such a packet;
  the broker re-encodes what it decoded (retained messages, wills, forwarding).

Byte-for-byte encode(decode(x)) == x is not promised: the encoder writes the shortest
forms (a v5 PUBACK without reason code), one order of user properties, v3 CONNACK codes
mapped through v5 ones; those are normalisations, not losses.

Engines: atheris (coverage-guided, `make fuzz`) when installed; otherwise, and in
`make test`, the seeded mutator of fuzz/streams.py over the same `check`.
"""

import argparse
import gc
import hashlib
import random
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Final

import broker.mqtt.decode
from broker.mqtt.codec import DEFAULT_MAX_PACKET_SIZE, Decoder, encode
from broker.mqtt.constants import MQTT_3_1, MQTT_3_1_1, MQTT_5, ReasonCode
from broker.mqtt.errors import MQTTError
from broker.mqtt.packets import Connect, Packet
from fuzz.streams import conversation, packets_of

VERSIONS: Final = (None, MQTT_3_1, MQTT_3_1_1, MQTT_5)
SMALL_LIMIT: Final = 96
WORK: Final = Path("build/fuzz")  # atheris corpus and crash files (build/ is git-ignored)


class Finding(Exception):
    """The decoder did something `check` says it must not."""


def header(version: int | None, cut: int = 128, small: bool = False) -> bytes:
    """The two bytes in front of the wire that set up `check`."""
    return bytes((VERSIONS.index(version) | (4 if small else 0), cut))


def check(data: bytes) -> None:
    if len(data) < 2:
        return
    version = VERSIONS[data[0] & 3]
    limit = SMALL_LIMIT if data[0] & 4 else DEFAULT_MAX_PACKET_SIZE
    wire = data[2:]
    whole, whole_error = _decode(version, limit, [wire])
    cut = data[1] * len(wire) // 256
    split, split_error = _decode(version, limit, [wire[:cut], wire[cut:]])
    if split != whole or _kind(split_error) != _kind(whole_error):
        raise Finding(f"cut at {cut}: {split!r} {split_error!r} but whole: "
                      f"{whole!r} {whole_error!r}")
    _round_trip(whole, version)


def _kind(error: MQTTError | None) -> tuple[type, int] | None:
    return None if error is None else (type(error), int(error.reason_code))


def _decode(
    version: int | None, limit: int, chunks: list[bytes]
) -> tuple[list[Packet], MQTTError | None]:
    decoder = Decoder(max_packet_size=limit, version=version)
    out: list[Packet] = []
    for chunk in chunks:
        try:
            out += decoder.feed(chunk)
        except MQTTError as error:
            packets = getattr(error, "packets", None)
            if not isinstance(packets, list):
                raise Finding(f"{error!r} without the packets decoded before it") from error
            ReasonCode(error.reason_code)  # a code the connection can send
            try:
                decoder.feed(b"")
            except MQTTError as again:
                if _kind(again) != _kind(error):
                    raise Finding(f"dead decoder raised {again!r} after {error!r}") from None
            else:
                raise Finding(f"decoder accepted input after {error!r}")
            return out + packets, error
    return out, None


def _round_trip(packets: list[Packet], version: int | None) -> None:
    """Each packet encoded at the version its connection had then, and decoded again."""
    for packet in packets:
        start: int | None = version
        if isinstance(packet, Connect):
            start, version = None, packet.protocol_level
        assert version is not None  # the decoder accepts nothing but CONNECT before one
        try:
            wire = encode(packet, version)
            again = Decoder(version=start).feed(wire)
        except (ValueError, MQTTError) as error:
            raise Finding(f"decoded {packet!r} at v{version}, round trip: {error!r}") from error
        if again != [packet]:
            raise Finding(f"decoded {packet!r} at v{version}, round trip gave {again!r}")


def seeds(seed: int, count: int = 400) -> list[bytes]:
    """Inputs to start from: whole valid conversations from a server's first byte, and
    single packets on a connection that already has their version."""
    out = [header(None) + b"".join(conversation(seed, i, broken=False).packets)[:4000]
           for i in range(count // 4)]
    out += [header(version) + packet[:4000] for version, packet in packets_of(seed, count)]
    return out


# ---- engines ---------------------------------------------------------------------------------
def mutator(seed: int, runs: int, on_finding: Callable[[bytes, str], None]) -> int:
    """Runs `check` on `runs` inputs drawn from `seed`: mutated conversations (whole, from
    a server's first byte) and mutated single packets; returns how many findings."""
    rng = random.Random(seed)
    findings = 0
    for i in range(runs):
        conv = conversation(seed, i)
        if rng.random() < 0.5:
            data = header(None, rng.randrange(256), rng.random() < 0.1) + b"".join(conv.packets)
        else:
            version = conv.version if rng.random() < 0.9 else rng.choice(VERSIONS[1:])
            data = header(version, rng.randrange(256), rng.random() < 0.1)
            data += rng.choice(conv.packets)
        try:
            check(data)
        except Exception:
            findings += 1
            on_finding(data, traceback.format_exc())
    return findings


def _instrument_codec() -> int:
    """Adds atheris' coverage instrumentation to the codec's functions (already imported:
    `atheris.instrument_imports` only sees imports made inside it). Compiled (mypyc)
    functions are not Python code and stay as they are; returns how many were done."""
    import atheris

    done = 0
    for obj in gc.get_objects():
        module = getattr(obj, "__module__", None) or ""
        if isinstance(obj, types.FunctionType) and module.startswith("broker.mqtt."):
            atheris.instrument_func(obj)
            done += 1
    return done


def _atheris(seed: int, runs: int, seconds: int, work: Path) -> int:
    import atheris

    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for data in seeds(seed):
        (corpus / f"seed-{hashlib.sha1(data).hexdigest()}").write_bytes(data)
    instrumented = _instrument_codec()
    compiled = not broker.mqtt.decode.__file__.endswith(".py")
    print(f"decoder fuzz: atheris, seed {seed}, {instrumented} codec functions instrumented"
          + (" (decoder compiled with mypyc: no coverage feedback from it; "
             "`python tools/build_native.py clean` for a pure-Python tree)" if compiled else ""),
          flush=True)
    args = [sys.argv[0], f"-seed={seed}", "-max_len=4096", f"-artifact_prefix={work}/",
            f"-max_total_time={seconds}", str(corpus)]
    if runs:
        args.insert(1, f"-runs={runs}")
    atheris.Setup(args, check)
    atheris.Fuzz()  # exits the process: 0 when done, non-zero with a crash file on a finding
    return 0


def _run_mutator(seed: int, runs: int, work: Path) -> int:
    def report(data: bytes, trace: str) -> None:
        work.mkdir(parents=True, exist_ok=True)
        path = work / f"crash-{hashlib.sha1(data).hexdigest()}"
        path.write_bytes(data)
        print(f"FINDING, saved as {path} (replay: python -m fuzz.decoder --replay {path})\n"
              f"{trace}", flush=True)

    started = time.monotonic()
    findings = mutator(seed, runs, report)
    print(f"decoder fuzz: seeded mutator, seed {seed}, {runs:,} inputs in "
          f"{time.monotonic() - started:.1f} s, {findings} findings", flush=True)
    return 1 if findings else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.decoder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("atheris", "mutator"), default="atheris")
    parser.add_argument("--seed", type=int, default=0, help="0: a random one (printed)")
    parser.add_argument("--runs", type=int, default=0,
                        help="inputs to run (atheris: 0 = until --seconds)")
    parser.add_argument("--seconds", type=int, default=60, help="atheris: time limit")
    parser.add_argument("--work", type=Path, default=WORK, help="corpus and crash files")
    parser.add_argument("--replay", type=Path, help="run `check` on one saved input")
    args = parser.parse_args(argv)
    if args.replay:
        check(args.replay.read_bytes())  # a finding raises, with its traceback
        print(f"{args.replay}: no finding")
        return 0
    seed = args.seed or random.randrange(1, 2**31)
    if args.engine == "atheris":
        try:
            import atheris  # noqa: F401
        except ImportError:
            print("atheris is not installed (pip install -e '.[fuzz]'): seeded mutator instead")
        else:
            return _atheris(seed, args.runs, args.seconds, args.work)
    return _run_mutator(seed, args.runs or 200_000, args.work)


if __name__ == "__main__":
    sys.exit(main())
