"""The GPU memory cap of scripts/gpu (memory_cap.py, run_lab.py's OOM lines) on CPU, with CUDA faked where needed."""
from __future__ import annotations

import memory_cap
import pytest
import run_lab
import torch


@pytest.mark.parametrize("raw, expected", [(None, None), ("", None), ("15", 15.0), (" 23.5 ", 23.5)])
def test_cap_from_env_reads_decimal_gb(raw, expected):
    environ = {} if raw is None else {memory_cap.CAP_ENV: raw}
    assert memory_cap.cap_from_env(environ) == expected


@pytest.mark.parametrize("raw", ["abc", "0", "-4", "15 23", "nan"])
def test_cap_from_env_rejects_what_is_not_a_positive_number(raw):
    with pytest.raises(ValueError, match=memory_cap.CAP_ENV):
        memory_cap.cap_from_env({memory_cap.CAP_ENV: raw})


@pytest.fixture
def fake_cuda(monkeypatch):
    """A CUDA device of 80e9 bytes whose set_per_process_memory_fraction calls are recorded."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: type("P", (), {"total_memory": 80e9})())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d)))
    return calls


def test_apply_cap_sets_the_fraction_of_device_memory(fake_cuda):
    line = memory_cap.apply_cap(16)
    assert fake_cuda == [(pytest.approx(0.2), 0)]
    assert "16 GB" in line and "Fake GPU" in line


def test_apply_cap_refuses_more_than_the_device_has(fake_cuda):
    with pytest.raises(ValueError, match="exceeds"):
        memory_cap.apply_cap(81)
    assert fake_cuda == []


def test_apply_cap_without_cuda_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "not applied" in memory_cap.apply_cap(15)


def test_startup_file_installs_the_cap_and_records_peaks(tmp_path, fake_cuda, monkeypatch):
    """Run the startup file as IPython would, with a fake shell, then fire the post-cell event twice."""
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", iter([3e9, 2e9]).__next__)
    hooks = []
    shell = type("Shell", (), {"events": type("Events", (), {"register": lambda self, e, f: hooks.append((e, f))})()})()
    record = tmp_path / "peaks.json"
    path = memory_cap.write_startup_file(tmp_path / "ipython", 15, record)
    exec(compile(path.read_text(), str(path), "exec"), {"get_ipython": lambda: shell})
    assert fake_cuda == [(pytest.approx(15 / 80), 0)]
    assert [event for event, _ in hooks] == ["post_run_cell"]
    for count in (1, 2):
        hooks[0][1](type("Result", (), {"execution_count": count})())
    cells = [{"execution_count": None}, {"execution_count": 1}, {"execution_count": 2}]
    assert run_lab.peak_reserved_gb(record, type("NB", (), {"cells": cells})()) == {
        "peak_reserved_gb": 3.0, "peak_cell_index": 1}


def test_oom_lines_finds_rows_reported_out_of_memory():
    cell = {"outputs": [
        {"output_type": "stream", "text": "seq_len status\n  8192     ok\n 16384    oom\n"},
        {"output_type": "stream", "text": ["B = 64, N = 1024: nan  (out of memory)\n", "done\n"]},
        {"output_type": "execute_result", "data": {"text/plain": "{('eager', 'oom'): 2}"}},
        {"output_type": "display_data", "data": {"image/png": "OOM"}},
        {"output_type": "stream", "text": "forward_ms (rows: d_model, seq_len; OOM = out of memory, - = no backward)\n"
                                          "forward_ms ('nan' = out of memory or no backward)\n"},
    ]}
    assert run_lab.oom_lines(cell) == [" 16384    oom", "B = 64, N = 1024: nan  (out of memory)",
                                       "{('eager', 'oom'): 2}"]
