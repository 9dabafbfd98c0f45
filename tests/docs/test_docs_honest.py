"""What the documentation claims that a machine can check, checked on every `make test`.

- The README's configuration reference is exactly what `render_markdown_table()` renders
  from the schema: every key in the code is in the table and every row of the table is a key.
- Every `make TARGET` the docs name is a target of the Makefile.
- Every `broker ctl GROUP VERB` the docs name parses (`broker ctl GROUP VERB --help`).
- Every relative link in a Markdown file, and every repository path the README names in
  backquotes, exists.
- No Markdown file reads as a work diary: history belongs in git, the docs describe the
  project as it is and how it is measured.
- Every figure of a benchmark table in the README is a number of the `bench/*results.json`
  its section names (tests/docs/readme_figures.py), and the throughput table is the one
  bench/report.py renders from its JSON.
"""

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench import every_table
from bench.report import readme_table
from broker.cli import main as broker_main
from broker.config.schema import SETTINGS, render_markdown_table
from tests.docs import readme_figures

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TABLE_HEADER = "| key | default | meaning |"


def _markdown_files() -> list[Path]:
    """The project's tracked Markdown files (not the venv's, not build output)."""
    listed = subprocess.run(["git", "ls-files", "-z", "*.md"], cwd=ROOT, capture_output=True,
                            check=False)
    if listed.returncode == 0 and listed.stdout:
        return sorted(ROOT / name for name in listed.stdout.decode().split("\0") if name)
    skip = {".venv", "build", "node_modules", ".git"}
    return sorted(path for path in ROOT.rglob("*.md")
                  if not skip.intersection(path.relative_to(ROOT).parts))


def _docs() -> list[Path]:
    """The user-facing documents whose commands must work."""
    return [README, ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _config_block(text: str) -> str:
    start = text.index(TABLE_HEADER)
    end = text.find("\n\n", start)
    return text[start:].rstrip("\n") if end < 0 else text[start:end]


def test_readme_config_table_is_exactly_the_generated_one() -> None:
    text = README.read_text()
    assert text.count(TABLE_HEADER) == 1, "one configuration reference table in the README"
    block = _config_block(text)
    assert block == render_markdown_table(), (
        "README's configuration table differs from the schema: paste the output of "
        "`.venv/bin/broker config docs` over it")
    documented = re.findall(r"^\| `([^`]+)` \|", block, re.M)
    assert documented == [setting.key for setting in SETTINGS]


def _make_targets() -> set[str]:
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*:(?!=)", line)
        if match and not line.startswith((".", "\t")):
            targets.update(match.group(1).split())
    return targets


def _named_make_targets(text: str) -> set[str]:
    named: set[str] = set()
    for match in re.finditer(r"`make((?:\s+[a-z][a-z0-9-]*)+)", text):
        named.update(match.group(1).split())
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S):
        for match in re.finditer(r"^\s*\$?\s*make((?:[ \t]+[a-z][a-z0-9-]*)+)", block, re.M):
            named.update(match.group(1).split())
    return named


@pytest.mark.parametrize("doc", _docs(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_make_target_named_exists(doc: Path) -> None:
    missing = _named_make_targets(doc.read_text()) - _make_targets()
    assert not missing, f"{doc.name} names make targets the Makefile lacks: {sorted(missing)}"


def _ctl_verbs(text: str) -> set[tuple[str, str]]:
    verbs = set()
    for match in re.finditer(r"broker ctl ([a-z]+) ([a-z][a-z-]*(?: ?\\?\| ?[a-z][a-z-]*)*)", text):
        for verb in re.split(r" ?\\?\| ?", match.group(2)):
            verbs.add((match.group(1), verb))
    return verbs


def test_every_broker_ctl_verb_named_parses(capsys: pytest.CaptureFixture[str]) -> None:
    named = set().union(*(_ctl_verbs(doc.read_text()) for doc in _docs()))
    assert ("cluster", "status") in named and ("ds", "forget") in named
    failed = []
    for group, verb in sorted(named):
        with pytest.raises(SystemExit) as exit_:
            broker_main(["ctl", group, verb, "--help"])
        if exit_.value.code != 0:
            failed.append(f"broker ctl {group} {verb}")
    capsys.readouterr()
    assert not failed, f"documented but refused: {failed}"


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_exist(doc: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if path and not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"


def test_paths_the_readme_names_exist() -> None:
    roots = "bench|broker|crds|docs|fuzz|helm|operator|spark-apps|tests|tools"
    missing = []
    for quoted in re.findall(r"`([^`\n]+)`", README.read_text()):
        if re.search(r"[#+<*{]", quoted):  # a topic filter or a pattern, not a path
            continue
        for path in re.findall(rf"(?:^|[\s=])((?:{roots})/[\w./-]*\w)", quoted):
            if not (ROOT / path).exists():
                missing.append(path)
    assert not missing, f"README names paths that do not exist: {sorted(set(missing))}"


# Work-diary wording: who did what when belongs in git, not in the documents.
DIARY = [
    (r"(?i)\bthis session\b", "this session"),
    (r"\bSession \d+\b", "Session N"),
    (r"(?i)\bmeasured and not taken\b", "measured and not taken"),
    (r"(?i)\b(earlier|later) (the same|that) day\b", "earlier the same day"),
    (r"(?i)\b(at|git|commit) [0-9a-f]{7,40}\b", "a git hash as history"),
    (r"(?i)\bother engineers\b", "other engineers"),
]


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_work_diary_language(doc: Path) -> None:
    found = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        for pattern, name in DIARY:
            if re.search(pattern, line):
                found.append(f"{doc.relative_to(ROOT)}:{number}: {name}: {line.strip()[:100]}")
    assert not found, "diary wording (history belongs in git):\n" + "\n".join(found)


# The README's benchmark tables against the JSON their runs wrote (tests/docs/readme_figures.py).
NOT_RESULTS = {
    "Faults: `make chaos`": "a fault run's counts, printed by tools/chaos.py, not a benchmark",
}
"""`### ` sections of "## Benchmarks" whose tables are not a benchmark's results."""


def _benchmark_tables() -> dict[str, list[readme_figures.Table]]:
    by_section: dict[str, list[readme_figures.Table]] = {}
    for table in readme_figures.tables(README.read_text()):
        if table.section not in NOT_RESULTS:
            by_section.setdefault(table.section, []).append(table)
    return by_section


@pytest.mark.parametrize("section", sorted(_benchmark_tables()))
def test_every_benchmark_figure_is_in_the_json_its_section_names(section: str) -> None:
    problems = [problem for table in _benchmark_tables()[section]
                for problem in readme_figures.mismatches(table, ROOT)]
    assert not problems, ("README figures that their bench/*results.json does not hold (run "
                          "the section's command again, or fix the figure):\n"
                          + "\n".join(problems))


def test_the_throughput_table_is_rendered_from_its_json() -> None:
    body = readme_figures.benchmark_sections(README.read_text())["Throughput: Mosquitto and amqtt"]
    rendered = readme_table(json.loads((ROOT / "bench" / "results.json").read_text()))
    assert rendered in body, (
        "the README's throughput table is not bench/results.json's: paste the table "
        "bench/run.py prints after a run of scenarios a-d (bench.report.readme_table)")


def test_a_figure_missing_from_its_json_is_named(tmp_path: Path) -> None:
    """The check can fail, and says where: the section, the figure, the JSON."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "x_results.json").write_text(json.dumps(
        {"rate": 140631.8, "p50_s": 0.0123, "rss_bytes": 13_736_345, "runs": [0.6495]}))
    readme = "\n".join([
        "## Benchmarks", "", "### Stated", "", "2026-12-06, `bench/x_results.json`:", "",
        "| measure | ours | ratio | target |", "|---|---|---|---|",
        "| rate (msgs/s) | 140,632 | 0.65x | >= 1.5x: met at load 7.3 |",
        "| p50 | 12.3 ms | 13.1 MiB | |",
        "| rate again | 140,633 | 0.64x | |", "",
        "### Unnamed", "", "| measure | ours |", "|---|---|", "| a | 1.5 s |", "",
        "### Missing", "", "`bench/gone_results.json`", "", "| a | b |", "|---|---|",
        "| x | 2 |", "", "## Development", ""])
    problems = [p for t in readme_figures.tables(readme)
                for p in readme_figures.mismatches(t, tmp_path)]
    assert problems == [
        "Stated: 140,633 is in none of bench/x_results.json",
        "Stated: 0.64x is in none of bench/x_results.json",
        "Unnamed: the section names no bench/*results.json file",
        "Missing: bench/gone_results.json does not exist",
    ]


def test_make_bench_runs_every_benchmark_table() -> None:
    """Each results section names a JSON that a step of `make bench` (bench/every_table.py)
    writes, so one command brings every table up to date."""
    written = {f"bench/{step.writes}" for step in every_table.STEPS}
    left_out = [section for section, tables in _benchmark_tables().items()
                if not written.intersection(tables[0].json_names)]
    assert not left_out, f"README benchmark sections `make bench` does not run: {left_out}"
    assert "bench/every_table.py" in (ROOT / "Makefile").read_text()
    shared = (ROOT / "bench" / "brokers.py").read_text()  # --brokers, --output, --no-pin
    unknown = [f"bench/{step.argv[0]} {option}" for step in every_table.STEPS
               for option in step.argv[1:] if option.startswith("--")
               and f'"{option}"' not in (ROOT / "bench" / step.argv[0]).read_text() + shared]
    assert not unknown, f"make bench passes options its scripts do not declare: {unknown}"
