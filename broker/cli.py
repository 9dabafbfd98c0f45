"""The `broker` command: `broker run` starts a node; `broker config docs` prints the reference;
`broker formats` lists the format versions of a node's data (read-only)."""

import argparse
import gc
import sys

from broker.version import RELEASE

# `broker run`'s, `formats`' and `config`'s modules are imported in their functions: `broker
# ctl` (an export, a backup job's) does not wait for them (a third of a second).


def _run(args: argparse.Namespace) -> int:
    # Start-up builds what lives as long as the process (modules, configuration, storage
    # state): the collector would walk it again and again (some 70 collections, a tenth of
    # the imports' CPU); server/app.py collects once when the node has started, freezes it
    # and turns the collector back on.
    gc.disable()
    import logging  # (here: an import's CLI does not use it)

    from broker import logsafe
    from broker.auth.security import SecurityFileError
    from broker.config.loader import ConfigError, load_config
    from broker.ds import SiteIdMismatch
    from broker.format_check import FormatRefused

    try:
        config = load_config(args.config, args.set or [])
    except ConfigError as error:
        print(f"broker: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config["log.console.level"].upper(),
        handlers=[logsafe.handler("%(asctime)s %(levelname)s %(name)s: %(message)s")],
    )
    from broker.server.app import run

    try:
        run(config)
    except (SiteIdMismatch, SecurityFileError, ConfigError, FormatRefused) as error:
        print(f"broker: cannot start: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"broker: cannot start: {error}", file=sys.stderr)
        return 1
    return 0


def _formats(args: argparse.Namespace) -> int:
    """What `broker run` with these options would find, without changing anything."""
    from broker.config.loader import ConfigError, load_config
    from broker.format_check import FormatRefused, inspect, trees

    overrides = [*(args.set or []), *([f"node.data_dir={args.data_dir}"] if args.data_dir else [])]
    try:
        found = inspect(*trees(load_config(args.config, overrides)))
    except (ConfigError, FormatRefused) as error:
        print(f"broker: {error}", file=sys.stderr)
        return 2
    print(f"{'FORMAT':<14} {'VERSION':>7} {'THIS RELEASE':>12}  STAMP")
    for item in found:
        stamp = (item.stamp if item.stamp.exists()
                 else f"{item.stamp} (none: 0.1.0, or nothing written yet)")
        print(f"{item.fmt.name:<14} {item.version:>7} {item.fmt.version:>12}  {stamp}")
    return 0


def _config_docs(_args: argparse.Namespace) -> int:
    from broker.config.schema import render_markdown_table

    print(render_markdown_table())
    return 0


_WITHOUT_CTL = frozenset({"run", "formats", "config"})
"""Commands parsed without `broker ctl`'s parser: its module (an HTTP client, the offline
tools) is not what starting a node should wait for (tests/unit/test_startup_imports.py)."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="broker", description="Durable MQTT broker")
    parser.add_argument("--version", action="version", version=RELEASE)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="start a broker node")
    run.add_argument("--config", "-c", help="TOML configuration file")
    run.add_argument("--set", "-s", action="append", metavar="KEY=VALUE",
                     help="override one configuration key (repeatable)")
    run.set_defaults(func=_run)
    formats = commands.add_parser("formats", help="list the format versions of a node's data"
                                  " (read-only; the options of `broker run`)")
    formats.add_argument("--data-dir", help="the node's data dir (node.data_dir)")
    formats.add_argument("--config", "-c", help="TOML configuration file")
    formats.add_argument("--set", "-s", action="append", metavar="KEY=VALUE",
                         help="override one configuration key (repeatable)")
    formats.set_defaults(func=_formats)
    config = commands.add_parser("config", help="configuration reference")
    config.add_argument("what", choices=["docs"])
    config.set_defaults(func=_config_docs)
    if not argv or argv[0] not in _WITHOUT_CTL:  # `ctl`, but also `--help` and mistakes
        from broker import ctl

        ctl.add_parser(commands)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
