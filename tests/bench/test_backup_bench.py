"""Smoke test of bench/backup_bench.py on a few MiB, one round: its figures mean something
only if every export and import it timed succeeded (the CLI's exit status: each export
checked whole as it arrived, each import checked before it was installed), the archive holds
the node's data and exports really ran while the publishers were measured. No timing is
asserted: the machine is shared."""

import json
from pathlib import Path

from bench import backup_bench


def test_quick_run_exports_imports_and_measures_publishers(tmp_path: Path) -> None:
    output = tmp_path / "backup_results.json"
    assert backup_bench.main(["--megabytes", "8", "--rounds", "1", "--output",
                              str(output)]) == 0
    data = json.loads(output.read_text())
    assert data["messages"] == 8 * 1024 * 1024 // data["payload_bytes"]
    assert data["archive_mib"] >= 8 and data["data_dir_mib"] >= 8
    for timed in ("export", "import", "tar_c", "tar_x"):
        assert len(data[timed]["rounds_s"]) == 1 and data[timed]["seconds"] > 0
    assert data["export_vs_tar"] > 0 and data["import_vs_tar"] > 0
    [pair] = data["publishers"]["pairs"]
    assert pair["exports_during"] >= 1
    assert pair["without_export_per_s"] > 0 and pair["during_export_per_s"] > 0
