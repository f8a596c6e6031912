"""A lab's declaration of what ``course measure`` times: the pieces, their cells and tests, shapes, dtypes, FLOP and
byte formulas and the metric it ranks by.

The declaration is ``MEASURE = {...}`` in ``labs/<lab>/measure.py`` (the course folder's, else the course tooling's
repository's), read with
``ast.literal_eval`` (data only: nothing in it runs). Formulas are arithmetic over a shape's names (and
``element_bytes``, the dtype's size; a piece's ``model`` entries for ``gpt2_decode``), evaluated without builtins.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from .measure_probe import KINDS
from .paths import REPO_ROOT

METRICS = {"tflops": "TFLOP/s", "gbps": "GB/s"}
TINY_CALLS = 2
REFERENCE = "(reference)"  # the student name of the instructor's solution's rows
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


@dataclass
class Piece:
    """One measured function of a lab.

    Attributes:
        name: short label of the piece (``triton_forward``).
        function: the student-facing name called in the kernel (``triton_attention_forward``).
        kind: a ``measure_probe.KINDS`` entry: how inputs are made, the call made and the reference computed.
        cells: grade ids of the cells that define it, run in notebook order after the lab's setup cells (an unlocked
            cell from the student's notebook, a locked one from the instructor's).
        tests: grade ids of its test cells; a submission is measured only when each earned its full score.
        dtype: the inputs' dtype name.
        shapes: the shapes measured on a GPU; ``tiny_shapes`` those of the CPU test mode.
        flops, bytes: formulas of the FLOP and of the fewest bytes one call must move (HBM).
        metric: ``tflops`` or ``gbps``: what the leaderboard and feedback show for the piece.
        tolerance: largest relative error ||out - ref|| / ||ref|| on the sampled output.
    """

    name: str
    function: str
    kind: str
    cells: list[str]
    tests: list[str]
    dtype: str
    shapes: list[dict]
    tiny_shapes: list[dict]
    flops: str
    bytes: str
    metric: str
    tolerance: float
    warmup: int = 3
    repeat: int = 20
    sets: int = 4
    timeout_s: float = 60.0
    model: dict = field(default_factory=dict)
    tiny_model: dict = field(default_factory=dict)
    cache_class: str = ""
    tiny_dtype: str = ""  # the CPU test mode's dtype, when the piece's does not run there (bf16 in Triton's interpreter)

    def on_cpu(self) -> "Piece":
        """This piece as the CPU test mode measures it: tiny shapes, tiny model, ``tiny_dtype``, at most
        ``TINY_CALLS`` input sets, warm-up calls and timed calls."""
        return replace(self, shapes=self.tiny_shapes, model=self.tiny_model, dtype=self.tiny_dtype or self.dtype,
                       sets=min(self.sets, TINY_CALLS), warmup=min(self.warmup, TINY_CALLS),
                       repeat=min(self.repeat, TINY_CALLS))

    def element_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def names(self, shape: dict) -> dict:
        """What the formulas may name for ``shape``: its entries, ``element_bytes`` and the model's entries."""
        return {**self.model, **shape, "element_bytes": self.element_bytes()}

    def flop_count(self, shape: dict) -> float:
        """FLOP of one call at ``shape``."""
        return evaluate(self.flops, self.names(shape))

    def byte_count(self, shape: dict) -> float:
        """Fewest bytes one call at ``shape`` moves through device memory."""
        return evaluate(self.bytes, self.names(shape))


@dataclass
class LabMeasure:
    """A lab's declaration: the setup cells every kernel runs first, the pieces, and how the leaderboard ranks."""

    lab: str
    setup_cells: list[str]
    pieces: list[Piece]
    rank_by: str = "roof_share"


_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Compare, ast.BoolOp, ast.Constant, ast.Name,
                  ast.Load, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Pow, ast.Mod, ast.USub, ast.UAdd,
                  ast.Not, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def evaluate(formula: str, names: dict) -> float:
    """The value of an arithmetic ``formula`` over ``names``.

    Raises:
        ValueError: the formula holds anything but arithmetic, comparisons, ``x if c else y`` and known names.
    """
    tree = ast.parse(formula, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise ValueError(f"formula {formula!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Name) and node.id not in names:
            raise ValueError(f"formula {formula!r} names {node.id!r}, not one of {sorted(names)}")
    return float(eval(compile(tree, "<formula>", "eval"), {"__builtins__": {}}, dict(names)))  # noqa: S307


def declaration_path(lab: str, course_root: Path | None = None) -> Path:
    """``labs/<lab>/measure.py`` of the course folder when it has one, else of the course tooling's repository."""
    own = course_root / "labs" / lab / "measure.py" if course_root else None
    return own if own and own.exists() else REPO_ROOT / "labs" / lab / "measure.py"


def read_declaration(path: Path) -> dict:
    """The literal ``MEASURE = {...}`` of ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["MEASURE"]:
            return ast.literal_eval(node.value)
    raise ValueError(f"{path} has no MEASURE = {{...}}")


def load(lab: str, course_root: Path | None = None) -> LabMeasure:
    """The declaration of ``lab``, checked.

    Raises:
        SystemExit: no declaration, or one that does not hold together (the message says what).
    """
    path = declaration_path(lab, course_root)
    if not path.exists():
        raise SystemExit(f"{lab} declares nothing to measure: {path} does not exist")
    try:
        data = read_declaration(path)
        pieces = [Piece(**piece) for piece in data["pieces"]]
        measure = LabMeasure(lab, list(data["setup_cells"]), pieces, data.get("rank_by", "roof_share"))
        for piece in pieces:
            problems = [f"kind {piece.kind!r} is not one of {KINDS}"] * (piece.kind not in KINDS)
            problems += [f"metric {piece.metric!r} is not one of {list(METRICS)}"] * (piece.metric not in METRICS)
            problems += [f"dtype {d!r} is not one of {list(DTYPE_BYTES)}" for d in (piece.dtype, piece.tiny_dtype)
                         if d and d not in DTYPE_BYTES]
            for variant in (piece, piece.on_cpu()):
                for shape in variant.shapes:
                    counts = (variant.flop_count(shape), variant.byte_count(shape))
                    if not all(math.isfinite(c) and c > 0 for c in counts):
                        problems.append(f"shape {shape}: FLOP and bytes must be positive, got {counts}")
            if problems:
                raise ValueError(f"piece {piece.name}: " + "; ".join(problems))
    except (ValueError, KeyError, TypeError, SyntaxError) as exc:
        raise SystemExit(f"{path}: {type(exc).__name__}: {exc}") from None
    return measure
