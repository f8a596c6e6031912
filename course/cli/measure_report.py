"""What ``course measure`` writes from its results: the TA's leaderboard (``grading/LAB/leaderboard.html`` and
``.csv``) and each student's page (``feedback/STUDENT/LAB/measure.html``: their points on the grading GPU's roofline
beside the reference solution's and the class's quartiles, no other student named).

Student-controlled text (error messages from their kernel, ids) is escaped by Jinja's autoescape in HTML and
neutralised against spreadsheet formulas in CSV (``course.common.spreadsheet``).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import io
import math
import secrets
import statistics
from pathlib import Path

import jinja2

from ..common.measure_spec import REFERENCE
from ..common.paths import TEMPLATES_DIR

TEMPLATES = TEMPLATES_DIR / "measure"
KEY_FILE = "measure_pseudonym.key"  # in grading/: the secret behind pseudonyms (same student, same pseudonym)
METRIC_UNITS = {"tflops": "TFLOP/s", "gbps": "GB/s"}
MARKERS = "osD^v<>"


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True)


def pseudonym(key: bytes, student: str) -> str:
    """A stable pseudonym (``s-`` and 8 hex digits) that only the course's key links to ``student``."""
    return "s-" + hmac.new(key, student.encode(), hashlib.sha256).hexdigest()[:8]


def pseudonym_key(grading_dir: Path) -> bytes:
    """The course's pseudonym key, made once (``grading/measure_pseudonym.key``, readable by its owner only)."""
    path = grading_dir / KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return bytes.fromhex(path.read_text().strip())


def roof_text(roofline: dict) -> str:
    peaks = ", ".join(f"{t:.3g} TFLOP/s {d}" for d, t in sorted(roofline["matmul_tflops"].items()))
    return f"{roofline['bandwidth_tb_s']:.3g} TB/s, {peaks}"


def _rate(row: dict, metric: str) -> float | None:
    return row.get("tflops") if metric == "tflops" else row.get("gbps")


def _fmt(value, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def columns(results: dict) -> list[tuple[str, str]]:
    """(piece, shape label) of every measured shape, in the declaration's order (the reference's rows)."""
    seen = []
    for row in results["rows"]:
        if (row["piece"], row["label"]) not in seen:
            seen.append((row["piece"], row["label"]))
    return seen


def by_student(results: dict) -> dict[str, dict[tuple[str, str], dict]]:
    table: dict[str, dict[tuple[str, str], dict]] = {}
    for row in results["rows"]:
        table.setdefault(row["student"], {})[(row["piece"], row["label"])] = row
    return table


def score(rows: dict[tuple[str, str], dict], wanted: list[tuple[str, str]]) -> float | None:
    """The ranking score: geometric mean of ``roof_share`` over every wanted shape; None unless all are ok."""
    shares = [rows.get(key, {}).get("roof_share") for key in wanted]
    if not shares or any(rows.get(key, {}).get("status") != "ok" or not share for key, share in zip(wanted, shares)):
        return None
    return math.exp(sum(math.log(s) for s in shares) / len(shares))


def leaderboard(results: dict, names: dict[str, str]) -> tuple[list[dict], list[tuple[str, str]]]:
    """Ranked entries (the reference among them, unnumbered) and (name, why) of the unranked."""
    wanted, table = columns(results), by_student(results)
    entries, unranked = [], []
    for student, rows in table.items():
        value = score(rows, wanted)
        if value is None and student != REFERENCE:
            failed: dict[str, list[str]] = {}  # status -> the shapes with it
            for piece, label in wanted:
                status = rows.get((piece, label), {}).get("status", "ok")
                if status != "ok":
                    failed.setdefault(status, []).append(f"{piece} {label}")
            failed = [f"{status}: {shapes[0]}" + (f" and {len(shapes) - 1} more" if len(shapes) > 1 else "")
                      for status, shapes in failed.items()]
            missing = [f"{piece}: not eligible" for piece in {p for p, _ in wanted} if
                       not any(k[0] == piece for k in rows)]
            unranked.append((names[student], "; ".join(missing + failed)))
            continue
        entries.append({"student": student, "name": names[student], "score": value, "rows": rows,
                        "reference": student == REFERENCE})
    entries.sort(key=lambda e: -(e["score"] or 0.0))
    rank = 0
    for entry in entries:
        if not entry["reference"]:
            rank += 1
        entry["rank"] = "ref" if entry["reference"] else rank
    for student, why in sorted(results["not_measured"].items()):
        if student not in table:
            unranked.append((names[student], why))
    return entries, unranked


def write_leaderboard(out_dir: Path, results: dict, names: dict[str, str], show_names: bool) -> None:
    """``leaderboard.html`` and ``leaderboard.csv`` in ``out_dir``."""
    from ..common.spreadsheet import write_csv

    wanted = columns(results)
    metric = {piece: info["metric"] for piece, info in results["pieces"].items()}
    entries, unranked = leaderboard(results, names)
    header = ["rank", "student", "share_of_roof", *[f"{p} {label} {METRIC_UNITS[metric[p]]}" for p, label in wanted]]
    lines = [header]
    for entry in entries:
        lines.append([entry["rank"], entry["name"], entry["score"],
                      *[_rate(entry["rows"].get(key, {}), metric[key[0]]) for key in wanted]])
    lines += [["", name, None, why] for name, why in unranked]
    write_csv(out_dir / "leaderboard.csv", lines)
    html_entries = []
    for entry in entries:
        cells = []
        for key in wanted:
            row = entry["rows"].get(key, {})
            ok = row.get("status") == "ok"
            text = (f"{_fmt(_rate(row, metric[key[0]]))} ({row['roof_share']:.0%})" if ok
                    else row.get("status", "not eligible"))
            cells.append({"text": text, "failed": not ok})
        html_entries.append({"rank": entry["rank"], "name": entry["name"], "reference": entry["reference"],
                             "score_text": f"{entry['score']:.1%}" if entry["score"] else "", "cells": cells})
    page = _env().get_template("leaderboard.html.j2").render(
        lab=results["lab"], gpu=results["gpu"], roof_text=roof_text(results["roofline"]),
        metric_text=" or ".join(sorted({METRIC_UNITS[m] for m in metric.values()})),
        measured_at=results["measured_at"], show_names=show_names,
        columns=[{"piece": p, "label": label} for p, label in wanted], entries=html_entries, unranked=unranked)
    (out_dir / "leaderboard.html").write_text(page)


def quartiles(results: dict) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(Q1, median, Q3) of the students' achieved TFLOP/s at each (piece, shape), over their correct rows."""
    values: dict[tuple[str, str], list[float]] = {}
    for row in results["rows"]:
        if row["student"] != REFERENCE and row["status"] == "ok":
            values.setdefault((row["piece"], row["label"]), []).append(row["tflops"])
    found = {}
    for key, vals in values.items():
        if len(vals) >= 2:
            q1, q2, q3 = statistics.quantiles(vals, n=4, method="inclusive")
        else:
            q1 = q2 = q3 = vals[0]
        found[key] = (q1, q2, q3)
    return found


def roofline_png(results: dict, student: str) -> str:
    """Base64 PNG: the GPU's measured roofline, ``student``'s correct rows, the reference's and the class's
    quartiles at each shape (x: FLOP/byte, y: TFLOP/s, both logarithmic)."""
    from matplotlib.figure import Figure

    roof = results["roofline"]
    rows = [r for r in results["rows"] if r["status"] == "ok"]
    intensities = [r["intensity_flop_per_byte"] for r in results["rows"]] or [1.0]
    low, high = min(intensities) / 4, max(intensities) * 4
    fig = Figure(figsize=(7.5, 4.8), dpi=100)
    ax = fig.add_subplot()
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    for dtype, peak in sorted(roof["matmul_tflops"].items()):
        ax.plot(xs, [min(peak, x * roof["bandwidth_tb_s"]) for x in xs], lw=1.2, label=f"roof ({dtype} matmul)")
    pieces = list(results["pieces"])
    spread = quartiles(results)
    for index, piece in enumerate(pieces):
        marker = MARKERS[index % len(MARKERS)]
        at = {r["label"]: r["intensity_flop_per_byte"] for r in results["rows"] if r["piece"] == piece}
        keys = [(piece, label) for label in at if (piece, label) in spread]
        if keys:
            mids = [spread[k][1] for k in keys]
            ax.errorbar([at[k[1]] for k in keys], mids, yerr=[[m - spread[k][0] for m, k in zip(mids, keys)],
                                                            [spread[k][2] - m for m, k in zip(mids, keys)]],
                        fmt="_", color="grey", capsize=4, label=f"{piece}: class quartiles")
        for who, style in ((REFERENCE, dict(mfc="none", mec="black", color="black")),
                           (student, dict(color="tab:red"))):
            mine = [r for r in rows if r["student"] == who and r["piece"] == piece]
            if mine:
                ax.plot([r["intensity_flop_per_byte"] for r in mine], [r["tflops"] for r in mine], marker, ls="none",
                        ms=7, label=f"{piece}: {'reference' if who == REFERENCE else 'you'}", **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"{results['lab']} on {results['gpu']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def feedback_page(results: dict, student: str) -> str:
    """``student``'s HTML page: the figure and a table of their rows beside the reference and the class median."""
    table = by_student(results)
    mine, reference = table.get(student, {}), table.get(REFERENCE, {})
    medians: dict[tuple[str, str], float] = {}
    for key in columns(results):
        times = [rows[key]["ms"] for who, rows in table.items()
                 if who != REFERENCE and key in rows and rows[key]["status"] == "ok"]
        if times:
            medians[key] = statistics.median(times)
    metric = {piece: info["metric"] for piece, info in results["pieces"].items()}
    rows = []
    for key, row in mine.items():
        ok = row["status"] == "ok"
        rows.append({"piece": key[0], "label": key[1], "ms": _fmt(row["ms"]) if ok else "",
                     "rate": f"{_fmt(_rate(row, metric[key[0]]))} {METRIC_UNITS[metric[key[0]]]}" if ok else "",
                     "share": f"{row['roof_share']:.0%}" if ok and row["roof_share"] else "",
                     "reference_ms": _fmt(reference.get(key, {}).get("ms")), "class_median_ms": _fmt(medians.get(key)),
                     "status": "correct, timed" if ok else f"{row['status']}: {row['reason']}"})
    return _env().get_template("feedback.html.j2").render(
        lab=results["lab"], gpu=results["gpu"], roof_text=roof_text(results["roofline"]), rows=rows,
        figure=roofline_png(results, student) if mine else "", not_measured=results["not_measured"].get(student, ""),
        credit_rule=results.get("extra_credit_rule"),
        credit=[f"{points:g} for {piece}" for piece, points in results.get("extra_credit", {}).get(student, {}).items()])


def write_all(course_root: Path, out_dir: Path, results: dict, show_names: bool) -> list[Path]:
    """The leaderboard in ``out_dir`` and every student's feedback page; the pages written."""
    key = pseudonym_key(course_root / "grading")
    students = {r["student"] for r in results["rows"]} | set(results["not_measured"])
    names = {s: s if show_names or s == REFERENCE else pseudonym(key, s) for s in students}
    names[REFERENCE] = REFERENCE
    write_leaderboard(out_dir, results, names, show_names)
    written = []
    for student in sorted(students - {REFERENCE}):
        path = course_root / "feedback" / student / results["lab"] / "measure.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(feedback_page(results, student))
        written.append(path)
    return written


def summary(results: dict) -> str:
    """A short text table of each submission's rows by status, for the terminal."""
    lines = [f"{results['lab']} measured on {results['gpu']} ({roof_text(results['roofline'])})"]
    for student, rows in by_student(results).items():
        counts: dict[str, int] = {}
        for row in rows.values():
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        value = score(rows, columns(results))
        lines.append(f"  {student:<24} {', '.join(f'{n} {s}' for s, n in sorted(counts.items())):<40} "
                     f"{'' if value is None else f'{value:.1%} of the roof'}")
    for student, why in sorted(results["not_measured"].items()):
        lines.append(f"  {student:<24} not measured: {why}")
    if rule := results.get("extra_credit_rule"):
        lines.append(f"extra credit ({rule['points']:g} points a piece at most {rule['ratio']:g} x the reference's "
                     f"time): {len(results.get('extra_credit', {}))} student(s)")
    return "\n".join(lines)
