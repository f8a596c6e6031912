"""Write ``assets/run_times.json``: how long each lab's run-all took, measured, for the labs' first code cell.

Reads the committed runs of ``scripts/gpu/run_lab.py``: ``reports/<card>/<lab>_run.json`` (teaching scale on the
course's GPU, ``course.common.paths.TEACHING_GPU``) and ``reports/cpu-2core/<lab>-cpu_run.json`` (cpu scale on a 2-core machine, ``--scale cpu --skip-autograde``).
``utils.print_environment_report(lab)`` prints the figure for the scale in effect.

Usage: ``python scripts/run_times.py`` (after committing new runs).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from course.common.paths import TEACHING_GPU, TEACHING_RUNS  # noqa: E402

SOURCES = {  # scale -> (run file pattern, where it was measured)
    "teaching": (f"{TEACHING_RUNS}/{{lab}}_run.json", TEACHING_GPU),
    "cpu": ("reports/cpu-2core/{lab}-cpu_run.json", "2-core CPU"),
}


def main() -> int:
    table: dict = {}
    for lab in sorted(p.name for p in (REPO / "labs").iterdir() if p.is_dir()):
        for scale, (pattern, machine) in SOURCES.items():
            path = REPO / pattern.format(lab=lab)
            if not path.is_file():
                continue
            run = json.loads(path.read_text()).get("teaching_run") or {}
            if run.get("total_s") is None or run.get("errors"):
                continue  # a run that raised is no measurement of the lab
            machine_record = json.loads(path.read_text()).get("machine") or {}
            during = machine_record.get("load_average_while_running")  # scripts/run_cpu_scale.py's samples
            load = [during["mean"]] if during else run.get("load_average") or [0, 0]
            cpus = machine_record.get("cpus") or run.get("cpus") or 1
            busy = max(load) > cpus  # other work shared the machine: an idle one is faster
            where = machine + (f" shared with other work (load average {max(load):.1f})" if busy else "")
            if machine_record.get("compile_caches"):
                where += f", {machine_record['compile_caches']} compile caches"
            table.setdefault(lab, {})[scale] = {"machine": where,
                                                "device": json.loads(path.read_text()).get("device"),
                                                "total_s": round(run["total_s"]), "source": pattern.format(lab=lab)}
    out = REPO / "assets" / "run_times.json"
    out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out.relative_to(REPO)}: {table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
