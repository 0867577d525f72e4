"""The memory a conversion needs, estimated from its dry run before anything is allocated, and the memory
the system has available for it: a length that cannot fit is refused in one line, not by the allocator.

A conversion holds the source's weights and builds every position table at the new length
(`positions.extend_positions`); at a long length the tables are most of it (all-MiniLM-L6-v2 at
10,000,000 tokens: 15.4 GB of its 15.5 GB of weights).
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from .architectures import Architecture, max_length_of
from .errors import InsufficientMemoryError, one_line
from .saving import readable_size

try:
    import resource
except ImportError:  # Windows: no address-space limit to read
    resource = None

# Bytes a conversion holds for each new position of a table besides the table: the row indices the tiling
# computes (`positions.continued_position_rows`) and the position and token type id buffers rebuilt beside it
# (38 measured on BERT).
BYTES_PER_POSITION = 48
# Bytes a sinusoidal table takes per value while it is computed (float64 angles, sines and cosines, float32
# halves): 10.5 measured on Pegasus.
SINUSOID_BUILD_BYTES = 12
# A limit at or above this is no limit (cgroup v1 writes "unlimited" as 2**63 rounded down to a page).
NO_LIMIT = 2**60
PROC_MEMINFO = Path("/proc/meminfo")
PROC_STATUS = Path("/proc/self/status")
PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class MemoryEstimate:
    """What a conversion holds, in bytes.

    Attributes:
        weights: the converted model's weights (the source's, its position tables at the new length).
        positions: the part of `weights` in position tables.
        peak: the most the conversion holds at once: `weights`, a source table beside the one built from
            it, and what building a table takes (row indices, a sinusoid's intermediate values).
    """

    weights: int
    positions: int
    peak: int


def conversion_memory(model: nn.Module, arch: Architecture, max_length: int) -> MemoryEstimate:
    """The memory converting to `max_length` tokens takes, from `model`: the LSG model the conversion loads,
    built on the meta device (shapes and dtypes, no memory: `head_choice.DryRun.model`)."""
    tensors = {id(tensor): tensor for tensor in itertools.chain(model.parameters(), model.buffers())}
    source = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    added = max_length - max_length_of(model)
    tables = [table.weight for table in arch.position_tables_in(model.base_model).values()]
    old = [table.numel() * table.element_size() for table in tables]
    new = [(table.shape[0] + added) * table.shape[1] * table.element_size() for table in tables]
    build = BYTES_PER_POSITION * max_length
    if arch.sinusoid_layout(model.config):
        build += SINUSOID_BUILD_BYTES * max((table.shape[0] + added) * table.shape[1] for table in tables)
    weights = source - sum(old) + sum(new)
    return MemoryEstimate(weights=weights, positions=sum(new), peak=weights + max(old, default=0) + build)


def check_conversion_memory(model: nn.Module, arch: Architecture, max_length: int) -> None:
    """InsufficientMemoryError, one line with the figures, where converting `model` (its dry run on the meta
    device) to `max_length` tokens needs more memory than `available_memory` says there is. Nothing where
    the system says nothing."""
    available = available_memory()
    estimate = conversion_memory(model, arch, max_length)
    if available is None or estimate.peak <= available:
        return
    raise InsufficientMemoryError(
        f"Converting to max_sequence_length={max_length} needs about {readable_size(estimate.peak)} of memory (the "
        f"converted weights: {readable_size(estimate.weights)}, {readable_size(estimate.positions)} of them position "
        f"tables), more than the {readable_size(available)} available: use a smaller max_sequence_length=, free memory, "
        "or pass skip_memory_check=True to try anyway."
    )


@contextmanager
def running_out_of_memory_refused(max_length: int) -> Iterator[None]:
    """An allocation that fails inside the block (torch's or numpy's) becomes an InsufficientMemoryError,
    one line: a conversion `check_conversion_memory` did not refuse (skip_memory_check=True)."""
    try:
        yield
    except (MemoryError, RuntimeError) as error:
        if not isinstance(error, (MemoryError, torch.OutOfMemoryError)) and "can't allocate memory" not in str(error):
            raise
        raise InsufficientMemoryError(
            f"Ran out of memory converting to max_sequence_length={max_length} ({one_line(error, 160)}): use a smaller "
            "max_sequence_length=, or free memory."
        ) from error


def available_memory() -> int | None:
    """Bytes this process can still allocate, as far as the system says: the least of the memory it has
    available (/proc/meminfo's MemAvailable), the room left under the process's address-space limit
    (RLIMIT_AS, ``ulimit -v``, less the process's size) and under its control groups' memory limits
    (cgroup v2 or v1, less what they use beyond reclaimable file pages). None where none can be read."""
    known = [room for room in (_meminfo_available(), _address_space_room(), *_cgroup_rooms()) if room is not None]
    return min(known, default=None)


def _meminfo_available() -> int | None:
    return _field_bytes(PROC_MEMINFO, "MemAvailable")


def _address_space_room() -> int | None:
    """RLIMIT_AS's soft limit less the process's virtual size (VmSize); None without a limit."""
    if resource is None:
        return None
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    size = _field_bytes(PROC_STATUS, "VmSize")
    if limit == resource.RLIM_INFINITY or size is None:
        return None
    return max(limit - size, 0)


def _field_bytes(path: Path, name: str) -> int | None:
    """The value of a 'Name:   123 kB' line of a /proc file, in bytes; None where there is none."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key == name:
            return int(value.split()[0]) * 1024
    return None


def _cgroup_rooms() -> list[int]:
    """The room left under each memory limit of the process's control group and of the groups above it."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return []
    rooms = []
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            files = ("memory.max", "memory.current", "inactive_file")
            root = CGROUP_ROOT
        elif "memory" in controllers.split(","):
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            root = CGROUP_ROOT / "memory"
        else:
            continue
        folder = root / group.lstrip("/")
        if not folder.is_dir():  # a group path of another namespace: the container's own root is the group
            folder = root
        for level in (folder, *folder.parents):
            room = _cgroup_room(level, *files)
            if room is not None:
                rooms.append(room)
            if level == root:
                break
    return rooms


def _cgroup_room(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    """The limit of the group in `folder` less its usage (its inactive file pages, which the kernel reclaims,
    left out); None where it has no limit or none can be read."""
    try:
        limit = (folder / limit_file).read_text().strip()
        usage = int((folder / usage_file).read_text())
        statistics = (folder / "memory.stat").read_text().splitlines()
    except (OSError, ValueError):
        return None
    if not limit.isdigit() or int(limit) >= NO_LIMIT:
        return None
    counts = dict(line.partition(" ")[::2] for line in statistics)
    inactive = int(counts.get(inactive_key, 0))
    return max(int(limit) - (usage - inactive), 0)
