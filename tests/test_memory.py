"""A length whose conversion cannot fit in the memory available is refused before anything is allocated,
in one line with the estimate (issue 47): `lsg-convert` runs in a child process whose address space is
limited (RLIMIT_AS, as `ulimit -v`) to its size after the imports plus 1 GiB; the tiny source at
32,000,000 tokens needs a 4.1 GB position table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import REPO_ROOT
from lsg_converter import memory
from lsg_converter.architectures import find_architecture, max_length_of
from lsg_converter.head_choice import choose_head

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc (Linux)")

ROOM = 2**30  # bytes the child may still map after its imports
LENGTH = 32_000_000  # tiny_bert_dir's table: 32,000,000 x 32 float32 = 4.1 GB
ERROR_PREFIX = "lsg-convert: error:"


def convert_with_little_memory(source: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """`lsg-convert source --max-len LENGTH --save-path out *flags` in a child whose address space is limited
    to its size after importing lsg_converter plus `ROOM`."""
    script = f"""
        import resource, sys
        import lsg_converter
        from lsg_converter_cli import main
        size = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + {ROOM}, resource.RLIM_INFINITY))
        sys.exit(main([{str(source)!r}, "--max-len", "{LENGTH}", "--save-path", {str(out)!r}, *{list(flags)!r}]))
    """
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=out.parent, env=environment,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )


def size_in_bytes(size: str) -> float:
    """'846.0 MB' -> 846e6 (the units of `saving.readable_size`)."""
    number, unit = size.split()
    return float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR_PREFIX), result.stderr[-3000:]
    return lines[0]


def test_a_length_that_cannot_fit_exits_11_in_one_line_naming_the_estimate(tiny_bert_dir, tmp_path):
    result = convert_with_little_memory(tiny_bert_dir, tmp_path / "out")

    line = error_line(result)
    assert result.returncode == 11
    needed, available = map(size_in_bytes, re.search(r"needs about ([\d.]+ [kMG]?B) .* the ([\d.]+ [kMG]?B) available", line).groups())
    assert 4.1e9 <= needed <= 6e9 and available <= ROOM
    assert f"--max-len {LENGTH}" in line and "a smaller --max-len" in line and "--skip-memory-check" in line
    assert not (tmp_path / "out").exists()


def test_skip_memory_check_tries_the_conversion_and_running_out_is_one_line(tiny_bert_dir, tmp_path):
    result = convert_with_little_memory(tiny_bert_dir, tmp_path / "out", "--skip-memory-check")

    line = error_line(result)
    assert result.returncode == 11
    assert "Ran out of memory converting to --max-len" in line and "can't allocate memory" in line
    assert not (tmp_path / "out").exists()


def test_the_estimate_is_the_converted_weights_and_the_building_of_the_table(tiny_bert_dir):
    arch = find_architecture("bert")
    from transformers import AutoConfig

    source_config = AutoConfig.from_pretrained(tiny_bert_dir)
    run = choose_head(arch, str(tiny_bert_dir), source_config, {}, None, None)
    table = run.model.bert.embeddings.position_embeddings.weight  # on the meta device
    added = LENGTH - max_length_of(run.model)

    estimate = memory.conversion_memory(run.model, arch, LENGTH)

    source = sum(tensor.numel() * tensor.element_size() for tensor in {*run.model.parameters(), *run.model.buffers()})
    new_table = LENGTH * table.shape[1] * 4
    assert table.device == torch.device("meta") and table.shape[0] + added == LENGTH
    assert estimate.positions == new_table
    assert estimate.weights == source - table.numel() * 4 + new_table
    assert estimate.peak == estimate.weights + table.numel() * 4 + memory.BYTES_PER_POSITION * LENGTH


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_available_memory_reads_the_control_groups_limit_less_what_it_holds(tmp_path, monkeypatch, version):
    """A container's limit (cgroup v1 or v2) of 3 GiB, of which 2 GiB are used, 0.5 GiB of them file pages the
    kernel reclaims: 1.5 GiB are available, however much the machine has."""
    gib = 2**30
    if version == "v2":
        group, files = tmp_path / "container", ("memory.max", "memory.current", "inactive_file")
        (tmp_path / "cgroup").write_text("0::/container\n")
    else:
        group, files = tmp_path / "memory" / "container", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        (tmp_path / "cgroup").write_text("4:memory:/container\n3:cpu:/\n")
    group.mkdir(parents=True)
    (group / files[0]).write_text(f"{3 * gib}\n")
    (group / files[1]).write_text(f"{2 * gib}\n")
    (group / "memory.stat").write_text(f"active_file 7\n{files[2]} {gib // 2}\n")
    monkeypatch.setattr(memory, "PROC_CGROUP", tmp_path / "cgroup")
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path)

    assert memory.available_memory() == min(3 * gib - (2 * gib - gib // 2), memory._meminfo_available())
