"""Grade Lab 1 submissions that break the GPU, on a GPU, and check each earns what it earns on a CPU grader.

Run from the repository root on a CUDA machine (``scripts/gpu/run_reports.sh cudafaults`` does):
``python scripts/gpu/check_cuda_faults.py --out DIR``. Three submissions of Lab 1, graded as TAs grade:

- ``reference``: the reference solution (every autograded point);
- ``device_assert``: the gemm answer cell first indexes a tensor out of bounds on ``DEVICE``. On the GPU that is a
  device-side assert, after which every CUDA call of the kernel fails; on a CPU it is an ``IndexError`` in that
  cell alone. ``course.cli.grade`` must notice the sticky error and grade the submission again without the GPU;
- ``cuda_oom``: the gemm answer cell first asks for 4 TiB on ``DEVICE`` (``torch.OutOfMemoryError`` on the GPU, a
  ``RuntimeError`` on a CPU); the kernel survives and only that question is lost.

Both broken submissions must earn the reference's points minus Question 1.1's, as on a CPU. Writes
``cuda_faults.json`` (outcomes, notes and per-cell scores) into DIR and exits non-zero when a check fails.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

LAB = "lab1"
BROKEN_FIRST_LINES = {
    "device_assert": "torch.zeros(2, device=DEVICE)[torch.tensor([10], device=DEVICE)].sum().item()\n",
    "cuda_oom": "torch.empty(4 * 2**40, dtype=torch.uint8, device=DEVICE)\n",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import torch

    from course.cli.grade import grade_lab
    from course.cli.nbgrader_run import make_course_dir
    from course.common.notebooks import grade_id, make_submission, read_notebook, replace_cell_source, write_notebook

    source = read_notebook(REPO / "source" / LAB / f"{LAB}.ipynb")
    reference = make_submission(read_notebook(REPO / "release" / LAB / f"{LAB}.ipynb"), source)
    gemm_answer = next(cell.source for cell in reference.cells if grade_id(cell) == "q1_1_gemm")
    course = make_course_dir(Path(tempfile.mkdtemp(prefix="cuda-faults-")), [LAB], REPO)
    write_notebook(reference, course / "submitted" / "reference" / LAB / f"{LAB}.ipynb")
    for student, first_line in BROKEN_FIRST_LINES.items():
        broken = replace_cell_source(reference, "q1_1_gemm", first_line + gemm_answer)
        write_notebook(broken, course / "submitted" / student / LAB / f"{LAB}.ipynb")

    outcomes, scores = grade_lab(course, LAB, progress=False)
    result = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "students": {}}
    for student, outcome in outcomes.items():
        cells = scores[student].cells if student in scores else {}
        result["students"][student] = {
            "status": outcome.status, "reason": outcome.reason, "notes": outcome.notes,
            "seconds": round(outcome.seconds, 1),
            "scores": {gid: cell.score for gid, cell in cells.items() if cell.autograded},
        }

    reference_scores = result["students"]["reference"]["scores"]
    expected = {gid: 0.0 if gid == "q1_1_gemm_tests" else score for gid, score in reference_scores.items()}
    checks = {"reference earns every autograded point": all(
        cell.score == cell.max_score for cell in scores["reference"].cells.values() if cell.autograded)}
    for student in BROKEN_FIRST_LINES:
        checks[f"{student} earns the reference's points minus Question 1.1's"] = (
            result["students"][student]["scores"] == expected)
    if torch.cuda.is_available():
        checks["device_assert was graded again on the CPU, with a note"] = any(
            note.startswith("graded on the CPU") for note in result["students"]["device_assert"]["notes"])
    result["checks"] = checks
    (args.out / "cuda_faults.json").write_text(json.dumps(result, indent=1))
    for student, entry in result["students"].items():
        print(f"{student}: {entry['status']}, {sum(entry['scores'].values()):g} autograded points, "
              f"{entry['seconds']} s; {entry['reason']} {entry['notes']}")
    for check, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {check}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
