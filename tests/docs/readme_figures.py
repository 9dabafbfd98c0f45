"""The link between the README's benchmark tables and the JSON files their runs wrote.

Why: a figure typed into the README by hand drifts from the run it came from (a table kept
0.65x Mosquitto long after the code it measured had changed). The convention is the one the
tables already follow: each `### ` section of "## Benchmarks" names, in backquotes, the
`bench/*results.json` files its tables come from (its intro line: date, machine, JSON), and
every figure in its tables must be a number of those files, as printed: rounded to the
digits shown, in the unit shown (s or ms or us, MiB or KiB, k or M). A ratio not stored in
the JSON may be the quotient of two figures of its own row (ours/Mosquitto). What is not a
measurement is not checked: the first column (the row's name), the header, and a target
(a figure after `<=`, `>=`, `<` or `>`).
"""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

JSON_NAME = re.compile(r"`(bench/[\w.-]*results\.json)`")
# A number as the README prints it: 1,025,500 / 0.65 / 1.3 / 167 (then its unit, if any).
NUMBER = re.compile(r"(?<![\w.,/])(?P<sign>[-+]?)(?P<digits>\d{1,3}(?:,\d{3})+|\d+)"
                    r"(?P<frac>\.\d+)?(?P<unit>k\b|M\b|x\b|%|\s?(?:ms|us|s|MiB|KiB|MB|GB)\b)?"
                    r"(?!\w)")
TARGET = re.compile(r"(?:<=|>=|<|>)\s*$")
TARGET_CELL = re.compile(r"(?:<=|>=|<|>)\s*\d")
# What a JSON number may have been multiplied by to be printed in the unit shown: seconds
# as ms or us, bytes as KiB or MiB, a rate as thousands (167k) or millions (2.8M), a share
# as %. A bare number takes its unit from the column's header, which is not parsed: any.
SCALES = {
    "": (1.0, 1e3, 1e-3, 1e6, 1e-6, 1 / 1024, 1 / 1024 ** 2, 1024.0, 100.0),
    "x": (1.0,), "%": (100.0, 1.0), "k": (1e-3,), "M": (1e-6,),
    "s": (1.0, 1e-3, 1e-6, 1e-9), "ms": (1.0, 1e3, 1e-3, 1e-6), "us": (1.0, 1e6, 1e3, 1e-3),
    "KiB": (1.0, 1 / 1024, 1024.0), "MiB": (1.0, 1 / 1024, 1 / 1024 ** 2),
    "MB": (1.0, 1e-6, 1 / 1024 ** 2), "GB": (1.0, 1e-9, 1 / 1024 ** 3, 1e-3, 1 / 1024),
}


@dataclass(frozen=True)
class Figure:
    """One number of a table cell, with the precision it was printed at."""

    text: str
    value: float
    decimals: int
    unit: str

    @property
    def is_ratio(self) -> bool:
        return self.unit == "x"

    def matches(self, number: float) -> bool:
        """Whether `number`, in a unit that prints as this one, rounds to this figure."""
        half = 0.5 * 10 ** -self.decimals * (1 + 1e-9)
        return any(abs(number * scale - self.value) <= half for scale in SCALES[self.unit])


@dataclass(frozen=True)
class Table:
    """The measured figures of one README table, by row, and the JSON files it names."""

    section: str
    json_names: tuple[str, ...]
    rows: tuple[tuple[Figure, ...], ...]


def figures(cell: str) -> list[Figure]:
    """The measured numbers of a cell; targets (`<= 0.1x`, and the whole of a cell that
    starts with one: `<= 1 s: met at load 7`) and digits inside a word (a git hash) left
    out."""
    found: list[Figure] = []
    if TARGET_CELL.match(cell.lstrip()):
        return found
    for match in NUMBER.finditer(cell):
        if TARGET.search(cell[:match.start()]):
            continue
        digits, frac = match.group("digits"), match.group("frac") or ""
        sign = -1.0 if match.group("sign") == "-" else 1.0
        value = sign * float(digits.replace(",", "") + frac)
        found.append(Figure(match.group(0).strip(), value, max(len(frac) - 1, 0),
                            (match.group("unit") or "").strip()))
    return found


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _table_rows(lines: list[str]) -> list[list[str]]:
    """A Markdown table's body rows (header and its `---` line dropped)."""
    body = [line for line in lines[1:] if not re.fullmatch(r"\|?[\s:|-]+\|?", line.strip())]
    return [_cells(line) for line in body]


def benchmark_sections(readme: str) -> dict[str, str]:
    """Each `### ` section of "## Benchmarks", by title."""
    heading = re.search(r"^## Benchmarks$", readme, re.M)
    if heading is None:
        raise ValueError('the README has no "## Benchmarks" section')
    end = readme.find("\n## ", heading.end())
    part = readme[heading.end():end if end >= 0 else len(readme)]
    sections = {}
    for chunk in re.split(r"\n(?=### )", part)[1:]:
        title, _, body = chunk.partition("\n")
        sections[title.removeprefix("### ").strip()] = body
    return sections


def tables(readme: str) -> list[Table]:
    """Every table of every benchmark section, with that section's JSON names."""
    found = []
    for title, body in benchmark_sections(readme).items():
        names = tuple(dict.fromkeys(JSON_NAME.findall(body)))
        block: list[str] = []
        for line in [*body.splitlines(), ""]:
            if line.lstrip().startswith("|"):
                block.append(line)
                continue
            if block:
                rows = tuple(tuple(f for cell in row[1:] for f in figures(cell))
                             for row in _table_rows(block))
                found.append(Table(title, names, rows))
                block = []
    return found


def json_numbers(data: object) -> list[float]:
    """Every number in a JSON document (booleans are not numbers here)."""
    if isinstance(data, bool) or data is None:
        return []
    if isinstance(data, int | float):
        return [float(data)] if math.isfinite(data) else []
    if isinstance(data, dict):
        return [n for value in data.values() for n in json_numbers(value)]
    if isinstance(data, list):
        return [n for value in data for n in json_numbers(value)]
    return []


def _quotient_of_row(figure: Figure, row: tuple[Figure, ...]) -> bool:
    """A ratio printed next to the figures it divides (ours / peer in the same row)."""
    others = [f.value for f in row if not f.is_ratio and f.value]
    return any(figure.matches(a / b) for i, a in enumerate(others)
               for j, b in enumerate(others) if i != j)


def mismatches(table: Table, root: Path) -> list[str]:
    """What in `table` is not in its JSON: each message names the section and the figure."""
    if not table.json_names:
        return [f"{table.section}: the section names no bench/*results.json file"]
    numbers: list[float] = []
    problems = []
    for name in table.json_names:
        path = root / name
        if not path.exists():
            problems.append(f"{table.section}: {name} does not exist")
            continue
        numbers.extend(json_numbers(json.loads(path.read_text())))
    if problems:
        return problems
    for row in table.rows:
        for figure in row:
            if any(figure.matches(n) for n in numbers):
                continue
            if figure.is_ratio and _quotient_of_row(figure, row):
                continue
            problems.append(f"{table.section}: {figure.text} is in none of "
                            f"{', '.join(table.json_names)}")
    return problems
