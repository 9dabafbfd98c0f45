"""spark-apps/python-installed-pyspark, the Python the mqtt-ds source's processes run with
on a local master: Spark's pyspark.zip on PYTHONPATH gives way to the installed pyspark it
belongs to (bytecode cached), and nothing else on the path changes."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[3] / "spark-apps" / "python-installed-pyspark"
_SHOW = "import json, sys; print(json.dumps(sys.path))"


def _path_seen(pythonpath: list[Path]) -> list[str]:
    env = {**os.environ, "MQTT_DS_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    shown = subprocess.run([str(LAUNCHER), "-c", _SHOW], env=env, check=True,
                           capture_output=True, text=True)
    return [p for p in json.loads(shown.stdout) if p]


def _zip(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
    return path


def test_the_zip_of_an_installed_pyspark_gives_way_to_it(tmp_path: Path) -> None:
    installed = tmp_path / "site-packages"
    (installed / "pyspark").mkdir(parents=True)
    (installed / "pyspark" / "__init__.py").write_text("")
    spark_zip = _zip(installed / "pyspark" / "python" / "lib" / "pyspark.zip")
    py4j = _zip(installed / "pyspark" / "python" / "lib" / "py4j-src.zip")
    mine = tmp_path / "spark apps"  # a space: paths split at ':' only
    seen = _path_seen([spark_zip, py4j, mine])
    assert seen[:3] == [str(installed), str(py4j), str(mine)]


def test_a_zip_without_its_installed_package_stays(tmp_path: Path) -> None:
    spark_zip = _zip(tmp_path / "home" / "pyspark" / "python" / "lib" / "pyspark.zip")
    assert _path_seen([spark_zip, tmp_path])[:2] == [str(spark_zip), str(tmp_path)]
