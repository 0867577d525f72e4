"""The benchmark scripts run end to end (their figures are read from benchmarks/RESULTS.md, not asserted)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow
def test_speed_benchmark_writes_its_table_memory_and_plot(tmp_path):
    results, plot = tmp_path / "RESULTS.md", tmp_path / "speed.png"
    models = ["identity", "lsg local 256/0 g1"]
    command = [
        sys.executable, str(BENCHMARKS / "bench_speed.py"), "--lengths", "512", "--layers", "1", "--repeats", "1",
        "--models", *models, "--results", "smoke test", "--results-file", str(results), "--plot", str(plot),
    ]

    finished = subprocess.run(command, capture_output=True, text=True, timeout=600)

    assert finished.returncode == 0, finished.stderr[-2000:]
    section = results.read_text()
    assert "## smoke test" in section and "![smoke test](speed.png)" in section
    for model in models:
        row = next(line for line in section.splitlines() if line.startswith(f"| {model} |"))
        forward, training, peak_mib = (float(cell) for cell in row.split("|")[2:5])
        assert forward > 0 and training > forward and peak_mib > 0
    assert plot.stat().st_size > 10_000
