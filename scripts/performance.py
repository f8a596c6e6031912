"""Write ``docs/PERFORMANCE.md``: one current table per lab of how long it takes to run and to grade, measured.

Every number comes from a committed run of ``scripts/gpu/run_lab.py`` (``reports/<card>/<lab>_run.json``: every cell at
teaching scale on the course's GPU, ``course.common.paths.TEACHING_GPU``, then one reference submission autograded there, or ``<lab>_autograde.json`` from a
later ``--skip-execute`` run; ``reports/cpu-2core/<lab>-cpu_run.json``:
every cell at cpu scale on a 2-core machine, made by ``scripts/run_cpu_scale.py``). Regenerate after committing new runs:
``python scripts/performance.py``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from course.common.paths import TEACHING_GPU, TEACHING_RUNS  # noqa: E402

RUNS = (  # (file pattern of a whole run, of a later autograde-only run, machine)
    (f"{TEACHING_RUNS}/{{lab}}_run.json", f"{TEACHING_RUNS}/{{lab}}_autograde.json", f"lent {TEACHING_GPU}"),
    ("reports/cpu-2core/{lab}-cpu_run.json", "reports/cpu-2core/{lab}_autograde.json", "2-core CPU (shared), no GPU"),
    ("reports/cpu-2core-idle/{lab}-cpu_run.json", "reports/cpu-2core-idle/{lab}_autograde.json",
     "2 cores of an idle 16-core Xeon host, no GPU"),
)


def _rows(lab: str) -> list[str]:
    rows = []
    for pattern, autograde_pattern, machine in RUNS:
        path = REPO / pattern.format(lab=lab)
        if not path.is_file():
            continue
        run = json.loads(path.read_text())
        where = f"[{pattern.format(lab=lab)}](../{pattern.format(lab=lab)})"
        regraded = REPO / autograde_pattern.format(lab=lab)
        if regraded.is_file():  # an autograde-only run after the grading code changed: it replaces the run's own
            run["autograde"] = json.loads(regraded.read_text()).get("autograde")
            graded_where = f"[{autograde_pattern.format(lab=lab)}](../{autograde_pattern.format(lab=lab)})"
        else:
            graded_where = where
        executed = run.get("teaching_run")
        if executed:
            scale = executed.get("scale", "teaching")
            raised = f", {len(executed['errors'])} cell(s) raised" if executed.get("errors") else ""
            load, record = executed.get("load_average"), run.get("machine") or {}
            during = record.get("load_average_while_running")
            if during:  # scripts/run_cpu_scale.py samples the load while the lab runs and names the cache state
                host = record.get("host_cpus") or record.get("cpus")
                on = f"{host} CPUs" if host == record.get("cpus") else f"the {host}-CPU host, run pinned to {record.get('cpus')}"
                busy = (f" (load average {during['min']:g} to {during['max']:g}, mean {during['mean']:g}, on {on}; "
                        f"{record.get('compile_caches', '?')} compile caches)")
            else:
                busy = f" (load average {load[0]:g} to {load[1]:g} on {executed.get('cpus')} CPUs)" if load else ""
            rows.append(f"| every cell, {scale} scale | {machine} ({run.get('torch', '?')}) | "
                        f"{executed['total_s']:.0f} s{raised}{busy} | {where} |")
        graded = run.get("autograde")
        if graded and graded.get("seconds") is not None:
            short = graded.get("cells_short_of_full_marks")
            points = "every autograded point" if short == [] else f"short of full marks in {short}"
            rows.append(f"| autograde one submission (the reference, quick scale: {points}) | "
                        f"{machine} | {graded['seconds']:.1f} s | {graded_where} |")
    return rows


def main() -> int:
    lines = ["# Performance", "",
             "How long each lab takes to run top to bottom and to grade, measured with the current code. Made by "
             "`scripts/performance.py` from the committed runs of `scripts/gpu/run_lab.py`; what students should "
             f"observe in each lab is in `reports/labN-{TEACHING_GPU.lower()}.md`. A run on a fresh machine includes its first "
             "compiles (cold compile caches). The 2-core machine is shared with other work: its load average while "
             "each lab ran is stated, and a load above its 2 CPUs means the run took longer than on an idle machine. "
             "The idle rows pin 2 cores (taskset) of the lent GPU machine, CUDA hidden, with that image's torch and "
             "Triton (`scripts/run_cpu_scale.py`); its cores are slower than the shared machine's for Lab 1's compiles.",
             ""]
    for lab in sorted(p.name for p in (REPO / "labs").iterdir() if p.is_dir()):
        rows = _rows(lab)
        lines += [f"## {lab.replace('lab', 'Lab ')}", "", "| what | machine | time | run |", "| --- | --- | --- | --- |",
                  *(rows or ["| (no committed run) | | | |"]), ""]
    grading = REPO / "reports" / "grading-time-cpu-2core.md"
    if grading.is_file():
        lines += ["## Grading a class", "",
                  "Grading time of Lab 1 on 2 cores, each speed piece of `course grade` A/B'd (`ahead`, `fork_server`): "
                  "[reports/grading-time-cpu-2core.md](../reports/grading-time-cpu-2core.md).", ""]
    out = REPO / "docs" / "PERFORMANCE.md"
    out.write_text("\n".join(lines))
    print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
