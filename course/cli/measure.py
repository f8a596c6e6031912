"""``python -m course measure LAB``: time the pieces a lab declares (markdown cells tagged ``measure`` beside its
questions: ``measure_cells``, ``measure_spec``) for every graded submission whose tests of those pieces earned full
marks, on the grading GPU, in the grading sandbox.

For each submission: a sandboxed kernel (``measure_session``) runs the lab's setup cells and the cells that define
each piece; then, for each declared shape, the kernel computes the piece once on a fresh input set and sends sampled
outputs, which the measuring process checks against its own reference on the same inputs (``measure_reference``);
only a correct piece is timed (CUDA events after warm-up, rotating over input sets) and checked once more on another
input set. A timeout, a dead kernel, an out-of-memory error or a CUDA fault costs that piece's row and nothing else;
nothing here writes a grade, except the optional extra credit for beating the reference (``measure_credit``, off by
default). Results: ``grading/LAB/measure.json`` and ``measure.csv``; then the leaderboard and each student's roofline
(``measure_report``). ``--shard i/n`` and ``--merge`` split a class over GPUs (``measure_shards``).
docs/GRADING.md ("Measuring kernels") is the TA's page.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import hashlib
import importlib.util
import json
import math
import os
import secrets
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from traitlets import Bool, Float
from traitlets.config import Configurable

from ..common.measure_spec import REFERENCE
from ..common.paths import REPO_ROOT

CPU_MODE_ENV = "EFFICIENT_AI_MEASURE_ON_CPU"  # test only: measure on the CPU at the declaration's tiny shapes
MAX_KERNEL_STARTS = 3  # per submission: a kernel lost (crash, CUDA fault) is replaced at most twice
CELL_TIMEOUT_S = 300.0  # setup and definition cells (imports, a Triton kernel's definition)


class Measure(Configurable):
    """``course measure``'s settings in ``nbgrader_config.py`` (``c.Measure.show_names = True``)."""

    show_names = Bool(False, help="The leaderboard shows students' ids instead of pseudonyms.").tag(config=True)
    extra_credit_points = Float(0.0, min=0.0, help=(
        "Extra credit (points) for each measured piece that beats the reference solution, recorded as nbgrader "
        "extra credit on the piece's first test cell; 0: off (course measure writes no grade).")).tag(config=True)
    extra_credit_ratio = Float(1.0, min=0.0, help=(
        "A piece beats the reference when the geometric mean over its shapes of its time over the reference's "
        "(same GPU, same run) is at most this: 1.0 as fast, 0.8 at least 20% faster.")).tag(config=True)


@dataclass
class Row:
    """One (submission, piece, shape) measurement. Times in ms; rates in TFLOP/s and GB/s; ``roof_share`` is the
    achieved FLOP/s over this GPU's measured roof at the shape's arithmetic intensity (FLOP/byte)."""

    student: str
    piece: str
    shape: dict
    label: str
    status: str  # ok, wrong, error, timeout, crashed, oom, cuda-fault, not-measured
    reason: str = ""
    ms: float | None = None  # median of the timed calls
    ms_min: float | None = None
    wall_ms_per_call: float | None = None  # the kernel's host clock over the timed loop, per call
    # The measuring process's own clock around the whole timing request (warm-up, timed and checked calls, the
    # request's overhead), per call: the one time the student's code cannot report, so extra credit is decided by it.
    grader_ms_per_call: float | None = None
    flops: float = 0.0
    bytes: float = 0.0
    intensity_flop_per_byte: float = 0.0
    tflops: float | None = None
    gbps: float | None = None
    roof_tflops: float = 0.0
    roof_share: float | None = None
    rel_err: float | None = None


def shape_label(shape: dict) -> str:
    """``B=16 S=1024 H=16 D=64 causal`` (a true flag by its name, a false one left out)."""
    return " ".join(k if v is True else f"{k}={v}" for k, v in shape.items() if v is not False)


def _seed(run_seed: int, *parts) -> int:
    digest = hashlib.sha256(json.dumps([run_seed, *parts], sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:6], "big")


def course_utils():
    """The course's ``utils.py`` (its roofline measurement), imported from the course tooling's repository."""
    spec = importlib.util.spec_from_file_location("_efficient_ai_course_utils", REPO_ROOT / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_ceilings(device: str, dtypes: list[str]) -> dict:
    """This device's roof, measured once per run (``utils.measure_roofline``: a large copy and a large matmul per
    dtype). On the CPU (test mode) at small sizes."""
    import torch

    utils = course_utils()
    names = sorted(set(dtypes))
    torch_dtypes = [getattr(torch, name) for name in names]
    if device == "cpu":
        return utils.measure_roofline(torch_dtypes, device="cpu", size=128, copy_mb=8, n_warmup=1, n_repeat=2)
    return utils.measure_roofline(torch_dtypes, device=device)


def roof_tflops(ceilings: dict, dtype: str, intensity: float) -> float:
    """Attainable TFLOP/s at ``intensity`` FLOP/byte: min(peak of ``dtype``, intensity x bandwidth)."""
    return min(ceilings["matmul_tflops"][dtype], intensity * ceilings["bandwidth_tb_s"])


@dataclass
class Context:
    """What every submission's measurement shares."""

    course_root: Path
    lab: str
    measure: object  # measure_spec.LabMeasure
    ceilings: dict
    run_seed: int
    tiny: bool
    timeout_s: float | None


def _cells(course_root: Path, lab: str, student: str | None, grade_ids: list[str]) -> list[tuple[str, str]]:
    """(grade id, source) of ``grade_ids`` in notebook order: a locked cell from the instructor's notebook, an
    unlocked one from the student's autograded notebook (``student`` None: the instructor's solution).

    Raises:
        ValueError: a cell is missing.
    """
    from ..common.notebooks import cells_by_grade_id, read_notebook

    source = cells_by_grade_id(read_notebook(course_root / "source" / lab / f"{lab}.ipynb"))
    mine = source if student is None else cells_by_grade_id(
        read_notebook(course_root / "autograded" / student / lab / f"{lab}.ipynb"))
    order = list(source)
    found = []
    for gid in sorted(grade_ids, key=lambda g: order.index(g) if g in order else len(order)):
        cell = source.get(gid)
        if cell is None:
            raise ValueError(f"the lab has no cell {gid!r}")
        locked = cell.metadata.get("nbgrader", {}).get("locked", False)
        chosen = cell if locked else mine.get(gid)
        if chosen is None:
            raise ValueError(f"the notebook has no cell {gid!r}")
        found.append((gid, chosen.source))
    return found


class Submission:
    """The measurement of one submission (or of the reference solution) on one GPU (``env``)."""

    def __init__(self, ctx: Context, student: str | None, pieces: list, env: dict[str, str], device: str):
        self.ctx, self.student, self.pieces, self.env, self.device = ctx, student, pieces, env, device
        self.name = REFERENCE if student is None else student
        self.kernel = None
        self.starts = 0
        self.defined: dict[str, str | None] = {}  # piece name -> None (defined) or the error of its cells

    def _start(self) -> str | None:
        """A fresh kernel with the setup cells, every piece's cells and the probe; None, or why it failed (then no
        kernel is left, and a failure while defining is final: the same cells would fail again)."""
        from .measure_session import KernelLost, MeasureKernel

        self.close()
        if self.starts >= MAX_KERNEL_STARTS:
            return f"not measured: the kernel was lost {self.starts} times"
        self.starts += 1
        try:
            try:
                self.kernel = MeasureKernel(self.ctx.course_root, self.ctx.lab, self.env)
            except KernelLost:  # before any student code ran: a busy machine, never the student's
                self.kernel = MeasureKernel(self.ctx.course_root, self.ctx.lab, self.env)
            failure = self._define()
        except KernelLost as exc:
            failure = f"the kernel was lost while defining the pieces: {exc}"
        except (ValueError, OSError) as exc:
            failure = f"{type(exc).__name__}: {exc}"
        if failure:
            self.close()
            self.starts = MAX_KERNEL_STARTS
        return failure

    def _define(self) -> str | None:
        """Run the setup cells, each piece's cells (a piece whose cell raises is noted in ``defined``) and the probe;
        None, or why the kernel cannot measure."""
        for gid, code in _cells(self.ctx.course_root, self.ctx.lab, None, self.ctx.measure.setup_cells):
            if error := self.kernel.run(code, CELL_TIMEOUT_S):
                return f"the setup cell {gid} failed: {error}"
        for piece in self.pieces:
            self.defined[piece.name] = None
            for gid, code in _cells(self.ctx.course_root, self.ctx.lab, self.student, piece.cells):
                if error := self.kernel.run(code, self.ctx.timeout_s or piece.timeout_s):
                    self.defined[piece.name] = f"cell {gid} raised {error}"
                    break
        return self.kernel.install_probe(CELL_TIMEOUT_S) and "the measuring probe could not be installed"

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
            self.kernel = None

    def run(self) -> list[Row]:
        rows = []
        for piece in self.pieces:
            stop = ""
            for index, shape in enumerate(piece.shapes):
                row = self._row(piece, shape)
                if stop:
                    row.status, row.reason = "not-measured", stop
                else:
                    self._measure(piece, index, shape, row)
                    if row.status == "timeout":
                        stop = "an earlier shape of this piece timed out"
                rows.append(row)
        self.close()
        return rows

    def _row(self, piece, shape: dict) -> Row:
        flops, nbytes = piece.flop_count(shape), piece.byte_count(shape)
        intensity = flops / nbytes
        return Row(self.name, piece.name, dict(shape), shape_label(shape), "not-measured", flops=flops, bytes=nbytes,
                   intensity_flop_per_byte=intensity,
                   roof_tflops=roof_tflops(self.ctx.ceilings, piece.dtype, intensity))

    def _measure(self, piece, index: int, shape: dict, row: Row) -> None:
        """Fill ``row``: check, then time and check again; a lost kernel is replaced for the next row."""
        from . import measure_reference as reference
        from .measure_session import PROBE_NAME, KernelLost

        if self.kernel is None and (failure := self._start()):
            row.status, row.reason = "error", failure
            return
        if self.defined.get(piece.name):
            row.status, row.reason = "error", self.defined[piece.name]
            return
        seed = _seed(self.ctx.run_seed, self.ctx.lab, piece.name, index)
        timeout_s = self.ctx.timeout_s or piece.timeout_s
        request = {"function": piece.function, "kind": piece.kind, "dtype": piece.dtype, "shape": shape,
                   "seed": seed, "device": "cuda" if self.device.startswith("cuda") else "cpu",
                   "sets": piece.sets, "warmup": piece.warmup, "repeat": piece.repeat,
                   "model": piece.model, "model_seed": _seed(self.ctx.run_seed, "model"),
                   "cache_class": piece.cache_class}
        for mode, check_set in zip(("check", "time"), reference.CHECK_SETS):
            rows = reference.sample(piece, shape, _seed(seed, mode))
            ask = {**request, "mode": mode, "check_set": check_set, "sample": rows}
            began_s = time.monotonic()
            try:
                answer = json.loads(self.kernel.evaluate(f"{PROBE_NAME}({json.dumps(ask)!r})", timeout_s))
                if not isinstance(answer, dict):
                    raise ValueError("the answer is not a JSON object")
            except KernelLost as exc:
                row.status = "timeout" if "timed out" in str(exc) else "crashed"
                row.reason = str(exc)
                self.close()
                return
            except ValueError as exc:
                row.status, row.reason = "error", f"no valid answer from the kernel ({exc})"
                return
            if answer.get("status") != "ok":
                self._failed(row, answer)
                return
            want = reference.reference(piece, shape, seed, check_set, rows, self.device, request["model_seed"])
            try:
                correct, error, why = reference.verdict(piece, shape, answer, want)
            except (ValueError, KeyError, TypeError) as exc:
                correct, error, why = False, math.inf, f"malformed output sample ({exc})"
            row.rel_err = None if math.isinf(error) else error
            if not correct:
                row.status = "wrong"
                row.reason = why + (" (in the check after timing)" if mode == "time" else " (not timed)")
                return
            if mode == "time":
                calls = piece.warmup + piece.repeat + 1  # the probe's warm-up, timed and checked calls
                self._timed(row, answer, grader_ms_per_call=(time.monotonic() - began_s) * 1e3 / calls)

    def _failed(self, row: Row, answer: dict) -> None:
        text = str(answer.get("error", ""))[:400]
        if answer.get("cuda_fault"):
            row.status, row.reason = "cuda-fault", text
            self.close()  # the CUDA context is unusable: the next shape gets a fresh kernel
        elif answer.get("oom"):
            row.status, row.reason = "oom", text
        else:
            row.status, row.reason = "error", text

    def _timed(self, row: Row, answer: dict, grader_ms_per_call: float) -> None:
        times_ms = [float(t) for t in answer.get("ms", [])]
        if not times_ms or not all(math.isfinite(t) and t > 0 for t in times_ms):
            row.status, row.reason = "error", "no valid timings came back"
            return
        row.status = "ok"
        row.ms, row.ms_min = statistics.median(times_ms), min(times_ms)
        row.wall_ms_per_call = float(answer.get("wall_ms", 0.0)) / len(times_ms)
        row.grader_ms_per_call = grader_ms_per_call
        seconds = row.ms * 1e-3
        row.tflops = row.flops / seconds / 1e12
        row.gbps = row.bytes / seconds / 1e9
        row.roof_share = row.tflops / row.roof_tflops if row.roof_tflops > 0 else None


def passed_pieces(scores, measure) -> tuple[list, str]:
    """The pieces whose test cells all earned full marks in ``scores`` (a SubmissionScores), and why the others
    are left out."""
    passed, missing = [], []
    for piece in measure.pieces:
        short = [gid for gid in piece.tests
                 if gid not in scores.cells or scores.cells[gid].score < scores.cells[gid].max_score - 1e-9]
        if short:
            missing.append(f"{piece.name}: {', '.join(short)} below full marks")
        else:
            passed.append(piece)
    return passed, "; ".join(missing)


def eligible(course_root: Path, lab: str, scores: dict, measure) -> tuple[list[tuple], dict[str, str]]:
    """The jobs, (student or None for the reference, pieces to measure), and why a student or a piece is left out."""
    jobs, skipped = [(None, measure.pieces)], {}
    for student in sorted(scores):
        notebook = course_root / "autograded" / student / lab / f"{lab}.ipynb"
        pieces, why = passed_pieces(scores[student], measure)
        if not notebook.exists():
            skipped[student] = "no autograded notebook"
        elif not pieces:
            skipped[student] = why
        else:
            jobs.append((student, pieces))
            if why:
                skipped[student] = why
    return jobs, skipped


def devices(workers: int, tiny: bool) -> list[tuple[dict, str]]:
    """(kernel environment, measuring device) per worker: one GPU each, from CUDA_VISIBLE_DEVICES or all GPUs."""
    import torch

    if tiny:
        return [({"CUDA_VISIBLE_DEVICES": "", "EFFICIENT_AI_SCALE": "quick", "TRITON_INTERPRET": "1"}, "cpu")] * workers
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [g.strip() for g in visible.split(",") if g.strip()] if visible else \
        [str(i) for i in range(torch.cuda.device_count())]
    if workers > len(ids):
        raise SystemExit(f"--workers {workers} needs {workers} GPUs (one per worker); {len(ids)} visible")
    return [({"CUDA_VISIBLE_DEVICES": gpu, "EFFICIENT_AI_SCALE": "quick"}, f"cuda:{i}") for i, gpu in
            enumerate(ids[:workers])]


def no_gpu_reason(tiny: bool) -> str | None:
    """Why this machine cannot measure (None: it can)."""
    if tiny:
        return None
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return ("course measure times kernels on the grading GPU, and this machine has no CUDA GPU that PyTorch can "
                "use. Run it on the GPU server (or a Slurm/Kubernetes GPU job) where `course grade` ran, after "
                "grading, with the course folder and gradebook it used.")
    return None


def measure_class(course_root: Path, lab: str, students: list[str] | None = None, workers: int = 1,
                  timeout_s: float | None = None, seed: int | None = None,
                  shard: tuple[int, int] | None = None) -> dict:
    """Measure the reference and every eligible submission; the results (``measure.json``'s content).

    Args:
        course_root: the course folder (nbgrader_config.py, source/, autograded/, the gradebook).
        lab: the lab, e.g. ``lab2``.
        students: only these (default: every submission in the gradebook).
        workers: submissions measured at once, one GPU each.
        timeout_s: limit of one request (a check, or the timing of one shape) in seconds; default: the piece's.
        seed: the run's seed (default: a random one, recorded).
        shard: (i, n): only shard i of n of those students (``course.cli.grade.shard_students``); the reference always.
    """
    from ..common import measure_spec
    from ..common.scores import read_scores
    from .grade import shard_students

    tiny = os.environ.get(CPU_MODE_ENV, "") == "1"
    if reason := no_gpu_reason(tiny):
        raise SystemExit(reason)
    measure = measure_spec.load(lab, course_root)
    if tiny:
        measure.pieces = [piece.on_cpu() for piece in measure.pieces]
    slots = devices(workers, tiny)
    dtypes = [piece.dtype for piece in measure.pieces]
    ceilings = measure_ceilings(slots[0][1], dtypes)
    run_seed = seed if seed is not None else secrets.randbelow(2 ** 31)
    ctx = Context(course_root, lab, measure, ceilings, run_seed, tiny, timeout_s)
    scores = read_scores(course_root, lab, students)
    scores = {student: scores[student] for student in shard_students(list(scores), shard)}
    jobs, skipped = eligible(course_root, lab, scores, measure)
    rows: list[Row] = []

    seconds: dict[str, float] = {}

    def work(slot_index: int, job) -> list[Row]:
        env, device = slots[slot_index]
        print(f"measuring {job[0] or REFERENCE} on {device}", file=sys.stderr, flush=True)
        start = time.monotonic()
        found = Submission(ctx, job[0], job[1], env, device).run()
        seconds[job[0] or REFERENCE] = time.monotonic() - start
        return found

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(slots)) as pool:
        free = list(range(len(slots)))
        pending = {}
        for job in jobs:
            if not free:
                done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    free.append(pending.pop(future))
                    rows.extend(future.result())
            slot = free.pop()
            pending[pool.submit(work, slot, job)] = slot
        for future in concurrent.futures.as_completed(pending):
            rows.extend(future.result())
    return {
        "lab": lab, "gpu": ceilings.get("device_name"), "device": ceilings.get("device"), "tiny_shapes": tiny,
        "roofline": ceilings, "run_seed": run_seed,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "pieces": {p.name: {"function": p.function, "metric": p.metric, "dtype": p.dtype, "credit_cell": p.tests[0]}
                   for p in measure.pieces},
        "shard": list(shard) if shard else None,
        "rank_by": measure.rank_by,
        "rows": [asdict(row) for row in sorted(rows, key=lambda r: (r.student != REFERENCE, r.student))],
        "not_measured": skipped,
        "seconds": seconds,  # wall-clock of each submission's measurement (kernel starts included)
    }


def write_results(out_dir: Path, results: dict) -> None:
    """``measure.json`` (everything) and ``measure.csv`` (one row per submission, piece and shape)."""
    from ..common.spreadsheet import write_csv

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "measure.json").write_text(json.dumps(results, indent=1))
    columns = ["student", "piece", "label", "status", "reason", "ms", "ms_min", "wall_ms_per_call", "grader_ms_per_call", "tflops", "gbps",
               "roof_tflops", "roof_share", "intensity_flop_per_byte", "flops", "bytes", "rel_err"]
    lines = [[row.get(c) for c in columns] for row in results["rows"]]
    lines += [[student, "", "", "not-measured", reason] + [None] * (len(columns) - 5)
              for student, reason in sorted(results["not_measured"].items())]
    write_csv(out_dir / "measure.csv", [["gpu", *columns], *[[results["gpu"], *line] for line in lines]])


def award_extra_credit(root: Path, lab: str, results: dict, settings: Measure) -> None:
    """With ``c.Measure.extra_credit_points`` > 0, record each considered student's extra credit in the gradebook
    (``measure_credit``) and in ``results`` (``extra_credit``: student -> piece -> points, only what was earned)."""
    from . import measure_credit

    earned = measure_credit.awards(results, settings.extra_credit_points, settings.extra_credit_ratio)
    if not earned:
        return
    for note in measure_credit.record(root, lab, results, earned):
        print(f"measure {lab}: {note}", file=sys.stderr)
    results["extra_credit"] = {s: {p: v for p, v in by_piece.items() if v} for s, by_piece in earned.items()
                               if any(by_piece.values())}
    results["extra_credit_rule"] = {"points": settings.extra_credit_points, "ratio": settings.extra_credit_ratio}


def main(lab: str, root: Path = REPO_ROOT, students: list[str] | None = None, workers: int = 1,
         timeout_s: float | None = None, report_only: bool = False, seed: int | None = None,
         shard: str | None = None, merge: bool = False) -> int:
    """The command: measure (unless ``report_only`` or ``merge``), write the results, the leaderboard and the
    feedback; a shard (``shard`` "i/n") writes only its results, which ``merge`` joins (``measure_shards``)."""
    from . import measure_report, measure_shards
    from .grade import parse_shard
    from .measure_session import course_config

    out_dir = root / "grading" / lab
    settings = Measure(config=course_config(root))
    if merge:
        results = measure_shards.merge(measure_shards.shard_results(out_dir))
        write_results(out_dir, results)
    elif report_only:
        if not (out_dir / "measure.json").exists():
            raise SystemExit(f"{out_dir / 'measure.json'} does not exist: run python -m course measure {lab} first")
        results = json.loads((out_dir / "measure.json").read_text())
    else:
        try:
            split = parse_shard(shard) if shard else None
        except ValueError as exc:
            raise SystemExit(f"measure {lab}: {exc}") from None
        results = measure_class(root, lab, students, workers, timeout_s, seed, split)
        award_extra_credit(root, lab, results, settings)
        if split:
            write_results(measure_shards.shard_dir(out_dir, split), results)
            print(measure_report.summary(results))
            print(f"wrote {measure_shards.shard_dir(out_dir, split) / 'measure.json'}; when every shard has finished: "
                  f"python -m course measure {lab} --merge")
            return 0
        write_results(out_dir, results)
    written = measure_report.write_all(root, out_dir, results, settings.show_names)
    print(measure_report.summary(results))
    print(f"wrote {out_dir / 'measure.json'}, measure.csv, {len(written)} feedback pages, leaderboard.html and .csv")
    return 0
