"""Cap the CUDA memory of a notebook kernel, to see how a lab behaves on a smaller GPU than the one at hand.

A 16 GB card (T4) or a 24 GB card (L4, A10, RTX 4090) is imitated on a larger one by limiting PyTorch's caching
allocator with ``torch.cuda.set_per_process_memory_fraction``: an allocation beyond the cap raises
``torch.OutOfMemoryError`` exactly as it would on the small card. The cap counts what the allocator holds, not
the CUDA context (a few hundred MB on the real card), so a cap a little under the card's size is the fair
imitation: a T4 shows 15360 MiB (16.1 GB) and an L4 or A10 about 23030 MiB (24.1 GB) in ``nvidia-smi``, of
which the CUDA context takes about 0.5 GB, so the report's runs cap the allocator at 15 GB and 23 GB.

The cap reaches a notebook's kernel through an IPython startup file (``write_startup_file``), so the notebook
runs unedited. The same file records, after every cell, the highest allocator reservation seen so far
(``torch.cuda.max_memory_reserved``; cells that reset the peak statistics make it a lower bound) into a JSON
file that ``scripts/gpu/run_lab.py`` reads back.

Environment: ``EFFICIENT_AI_GPU_MEMORY_GB`` (decimal GB, 1 GB = 1e9 bytes) is the cap ``run_lab.py`` applies
when ``--gpu-memory-gb`` is not given.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

CAP_ENV = "EFFICIENT_AI_GPU_MEMORY_GB"
BYTES_PER_GB = 1e9


def cap_from_env(environ=None) -> float | None:
    """The cap in GB from ``EFFICIENT_AI_GPU_MEMORY_GB``, or None when unset or empty.

    Raises:
        ValueError: the variable is set but is not a positive number of GB.
    """
    raw = (os.environ if environ is None else environ).get(CAP_ENV, "").strip()
    if not raw:
        return None
    try:
        cap_gb = float(raw)
    except ValueError:
        cap_gb = float("nan")
    if not cap_gb > 0:
        raise ValueError(f"{CAP_ENV}={raw!r}: expected a positive number of GB (1 GB = 1e9 bytes), e.g. 15")
    return cap_gb


def apply_cap(cap_gb: float) -> str:
    """Limit this process's CUDA caching allocator to ``cap_gb`` GB; return one line saying what was done.

    Args:
        cap_gb: The cap in decimal GB (1e9 bytes). It must be positive and at most the device's memory.

    Returns:
        str: The line to print (on a machine without CUDA: that nothing was capped).

    Raises:
        ValueError: cap_gb is not positive or exceeds the device's total memory.
    """
    import torch

    if not cap_gb > 0:
        raise ValueError(f"GPU memory cap must be a positive number of GB, got {cap_gb!r}")
    if not torch.cuda.is_available():
        return f"GPU memory cap of {cap_gb:g} GB not applied: no CUDA device"
    total_bytes = torch.cuda.get_device_properties(0).total_memory
    fraction = cap_gb * BYTES_PER_GB / total_bytes
    if fraction > 1:
        raise ValueError(f"GPU memory cap of {cap_gb:g} GB exceeds the device's {total_bytes / BYTES_PER_GB:.1f} GB")
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return (f"GPU memory capped at {cap_gb:g} GB ({fraction:.3f} of {torch.cuda.get_device_name(0)}'s "
            f"{total_bytes / BYTES_PER_GB:.1f} GB) for PyTorch's allocator")


def _record_peak(record_path: str, peaks: list, result=None) -> None:
    """IPython post_run_cell hook: append (execution count, peak reserved bytes) and rewrite the record."""
    import torch

    if not torch.cuda.is_available():
        return
    peaks.append([getattr(result, "execution_count", None), int(torch.cuda.max_memory_reserved())])
    Path(record_path).write_text(json.dumps({"peak_reserved_bytes_after_cell": peaks}))


def install(cap_gb: float, record_path: str | None = None, shell=None) -> str:
    """Apply the cap in this process and, inside IPython, record peak reservations after every cell.

    Args:
        cap_gb: The cap in decimal GB.
        record_path: JSON file rewritten after every cell; None records nothing.
        shell: The IPython shell (``get_ipython()``); None records nothing.

    Returns:
        str: The line ``apply_cap`` returned.
    """
    line = apply_cap(cap_gb)
    if shell is not None and record_path:
        peaks: list = []
        shell.events.register("post_run_cell", lambda result=None: _record_peak(record_path, peaks, result))
    return line


def write_startup_file(ipython_dir: Path, cap_gb: float, record_path: Path) -> Path:
    """Write an IPython startup file under ``ipython_dir`` that caps every kernel started with that directory.

    Start the kernel with ``IPYTHONDIR=ipython_dir`` in its environment.

    Args:
        ipython_dir: A fresh directory to use as ``IPYTHONDIR``.
        cap_gb: The cap in decimal GB.
        record_path: Where the kernel writes its peak reservations (JSON).

    Returns:
        Path: The startup file written.
    """
    startup = Path(ipython_dir) / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    path = startup / "00-gpu-memory-cap.py"
    here = str(Path(__file__).resolve().parent)
    path.write_text(
        "import sys\n"
        f"sys.path.insert(0, {here!r})\n"
        "import memory_cap\n"
        f"print(memory_cap.install({float(cap_gb)!r}, {str(record_path)!r}, get_ipython()))\n"
        f"sys.path.remove({here!r})\n"
    )
    return path
