"""What the documentation claims that a machine can check, checked on every `make test`.

- The README's configuration reference is exactly what `render_markdown_table()` renders
  from the schema: every key in the code is in the table and every row of the table is a key.
- Every `make TARGET` the docs name is a target of the Makefile.
- Every `broker ctl GROUP VERB` the docs name parses (`broker ctl GROUP VERB --help`).
- Every relative link in a Markdown file, and every repository path the README names in
  backquotes, exists.
- No Markdown file reads as a work diary: history belongs in git, the docs describe the
  project as it is and how it is measured.
"""

import re
import subprocess
from pathlib import Path

import pytest

from broker.cli import main as broker_main
from broker.config.schema import SETTINGS, render_markdown_table

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
