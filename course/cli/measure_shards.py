"""``course measure LAB --shard i/n`` and ``--merge``: a class split over GPUs (a Slurm array task or a Kubernetes
Indexed Job pod each, one GPU per worker), then one results file.

Shard i of n measures the reference and every n-th student (``course.cli.grade.shard_students``, the split ``course
grade --shard`` uses) and writes ``grading/LAB/shard-i-of-n/measure.json`` and ``.csv``, nothing else: the leaderboard
and the feedback pages need the whole class (its quartiles, its ranks). ``--merge`` then reads every shard's file,
refuses a missing shard or a mix of splits, and writes ``grading/LAB/measure.json`` as one run would have (the
reference's rows of shard 0; each shard's GPU and roof under ``shards``); the leaderboard and feedback follow. Each
row's share of the roof was computed on its own shard's GPU, against that GPU's measured roof.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..common.measure_spec import REFERENCE

SHARD_DIR_RE = re.compile(r"^shard-(?P<index>\d+)-of-(?P<count>\d+)$")


def shard_dir(out_dir: Path, shard: tuple[int, int]) -> Path:
    """``grading/LAB/shard-i-of-n`` (the folder ``course grade --shard i/n`` writes its table into)."""
    return out_dir / f"shard-{shard[0]}-of-{shard[1]}"


def shard_results(out_dir: Path) -> list[dict]:
    """The results of every shard of one split, in shard order.

    Raises:
        SystemExit: no shard results, shards of different splits, or a shard missing (the message says which).
    """
    found: dict[tuple[int, int], Path] = {}
    for path in sorted(out_dir.glob("shard-*-of-*/measure.json")):
        if match := SHARD_DIR_RE.match(path.parent.name):
            found[(int(match["index"]), int(match["count"]))] = path
    if not found:
        raise SystemExit(f"no shard results under {out_dir}: run python -m course measure LAB --shard i/n first")
    counts = sorted({count for _, count in found})
    if len(counts) > 1:
        raise SystemExit(f"{out_dir} holds shards of several splits (n = {', '.join(map(str, counts))}): remove the "
                         "folders of the old one")
    missing = [f"{i}/{counts[0]}" for i in range(counts[0]) if (i, counts[0]) not in found]
    if missing:
        raise SystemExit(f"shard(s) {', '.join(missing)} have no results yet: wait for them or run them again")
    return [json.loads(found[(i, counts[0])].read_text()) for i in range(counts[0])]


def merge(parts: list[dict]) -> dict:
    """One results dict from the shards' (``course.cli.measure.measure_class``'s form, plus ``shards``).

    Raises:
        SystemExit: the shards measured different labs, or one student twice.
    """
    first = parts[0]
    if len({part["lab"] for part in parts}) > 1:
        raise SystemExit(f"the shards measured different labs: {sorted({part['lab'] for part in parts})}")
    rows = [row for row in first["rows"] if row["student"] == REFERENCE]
    owner: dict[str, int] = {}
    merged = {**first, "rows": rows, "not_measured": {}, "seconds": {}, "extra_credit": {}, "shards": []}
    for index, part in enumerate(parts):
        students = {r["student"] for r in part["rows"] if r["student"] != REFERENCE} | set(part["not_measured"])
        if twice := sorted(s for s in students if s in owner):
            raise SystemExit(f"{', '.join(twice)} measured by shards {owner[twice[0]]} and {index}")
        owner.update(dict.fromkeys(students, index))
        rows += [row for row in part["rows"] if row["student"] != REFERENCE]
        merged["not_measured"].update(part["not_measured"])
        merged["seconds"].update({s: t for s, t in part["seconds"].items() if s != REFERENCE or index == 0})
        merged["extra_credit"].update(part.get("extra_credit", {}))
        merged["shards"].append({key: part.get(key) for key in ("shard", "gpu", "device", "roofline", "run_seed",
                                                                 "measured_at")})
    gpus = list(dict.fromkeys(part["gpu"] for part in parts))
    merged["gpu"] = gpus[0] if len(gpus) == 1 else " / ".join(map(str, gpus))
    merged["shard"] = None
    return merged
