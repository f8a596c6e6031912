"""A lab's declaration of what ``course measure`` times: the pieces, their cells and tests, shapes, dtypes, FLOP and
byte formulas and the metric it ranks by.

Each piece is declared in a markdown cell tagged ``measure`` right after the question it measures
(``measure_cells``), in the course folder's instructor notebook ``source/<lab>/<lab>.ipynb``, read with
``ast.literal_eval`` (data only: nothing in it runs). Formulas are arithmetic over a shape's names (and
``element_bytes``, the dtype's size; a piece's ``model`` entries for ``gpt2_decode``), evaluated without builtins.
``problems`` is what ``course lint`` reports; no torch is imported here, so lint stays light.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from .paths import REPO_ROOT

METRICS = {"tflops": "TFLOP/s", "gbps": "GB/s"}
TINY_CALLS = 2
REFERENCE = "(reference)"  # the student name of the instructor's solution's rows
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
SETUP_CELLS = ["setup_imports"]  # a piece's default setup cells: the lab's imports
# What each kind's inputs are made from (``measure_probe.KINDS``, which the kernel runs; a test keeps the two equal).
SHAPE_KEYS = {"attention_bshd": ("B", "S", "H", "D"), "attention_bhsd": ("B", "S", "H", "D"), "gelu_tanh": ("N",),
              "gpt2_decode": ("B", "N")}
KINDS = tuple(SHAPE_KEYS)
MODEL_KEYS = ("n_layer", "n_embd", "n_head", "vocab_size")


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
        setup_cells: grade ids of locked cells every measuring kernel runs first (default ``setup_imports``).
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
    setup_cells: list[str] = field(default_factory=lambda: list(SETUP_CELLS))

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


def declaration_notebook(lab: str, course_root: Path | None = None) -> Path:
    """The instructor notebook holding ``lab``'s declarations: the course folder's ``source/<lab>/<lab>.ipynb``."""
    return (course_root or REPO_ROOT) / "source" / lab / f"{lab}.ipynb"


def _shape_problems(piece: Piece) -> list[str]:
    """Shapes the piece's kind cannot make inputs from, and shapes whose FLOP or bytes are not positive."""
    problems = []
    for variant, which in ((piece, "shapes"), (piece.on_cpu(), "tiny_shapes")):
        if not variant.shapes or not all(isinstance(shape, dict) for shape in variant.shapes):
            problems.append(f"{which} must be a non-empty list of dicts")
            continue
        for shape in variant.shapes:
            missing = [key for key in SHAPE_KEYS.get(piece.kind, ()) if key not in shape]
            bad = [key for key, value in shape.items()
                   if not (isinstance(value, bool) or (isinstance(value, int) and value > 0))]
            if missing or bad:
                problems.append(f"{which} entry {shape}: " + "; ".join(
                    [f"kind {piece.kind} needs {', '.join(missing)}"] * bool(missing) +
                    [f"{', '.join(bad)} must be a positive integer (or True/False)"] * bool(bad)))
                continue
            try:
                counts = (variant.flop_count(shape), variant.byte_count(shape))
            except (ValueError, ZeroDivisionError, TypeError) as exc:
                problems.append(f"{which} entry {shape}: {exc}")
                continue
            if not all(math.isfinite(c) and c > 0 for c in counts):
                problems.append(f"{which} entry {shape}: FLOP and bytes must be positive, got {counts}")
    return problems


def piece_problems(piece: Piece) -> list[str]:
    """What does not hold together in one piece by itself (kind, metric, dtypes, model, shapes, formulas)."""
    problems = [f"kind {piece.kind!r} is not one of {list(KINDS)}"] * (piece.kind not in KINDS)
    problems += [f"metric {piece.metric!r} is not one of {list(METRICS)}"] * (piece.metric not in METRICS)
    problems += [f"dtype {d!r} is not one of {list(DTYPE_BYTES)}" for d in (piece.dtype, piece.tiny_dtype)
                 if d and d not in DTYPE_BYTES]
    if piece.kind == "gpt2_decode":
        problems += [f"{which} lacks {', '.join(k for k in MODEL_KEYS if k not in model)}"
                     for which, model in (("model", piece.model), ("tiny_model", piece.tiny_model))
                     if not all(k in model for k in MODEL_KEYS)]
        problems += ["cache_class must name the lab's cache class"] * (not piece.cache_class)
    if not piece.tolerance > 0:
        problems.append(f"tolerance must be > 0, got {piece.tolerance}")
    if not problems:
        problems += _shape_problems(piece)
    return problems


def _cell_problems(piece: Piece, nb, index: int) -> list[str]:
    """Grade ids the piece names that the notebook lacks or that are the wrong kind of cell, and cells named that
    come after the declaration (it sits right after the question it measures)."""
    from .notebooks import grade_id, is_autograded_test, is_bonus_cell, nbgrader_meta

    where = {grade_id(cell): (i, cell) for i, cell in enumerate(nb.cells) if grade_id(cell)}
    problems = []
    for field_name, ids, wanted, is_kind in (
            ("cells", piece.cells, "a code cell", lambda c: c.cell_type == "code"),
            ("tests", piece.tests, "an autograded test cell", is_autograded_test),
            ("setup_cells", piece.setup_cells, "a locked code cell",
             lambda c: c.cell_type == "code" and nbgrader_meta(c).get("locked", False))):
        if not ids:
            problems.append(f"{field_name} is empty")
        for gid in ids:
            if gid not in where:
                problems.append(f"{field_name}: grade id {gid!r} is not in the lab")
            elif not is_kind(where[gid][1]):
                problems.append(f"{field_name}: {gid!r} is not {wanted}")
            elif field_name != "setup_cells" and where[gid][0] > index:
                problems.append(f"{field_name}: {gid!r} comes after the declaration (put it right after the question)")
    credit = piece.tests[0] if piece.tests else None
    if credit in where and is_bonus_cell(where[credit][1]):
        problems.append(f"tests: the first, {credit!r}, takes the extra credit of course measure and must not be a "
                        "bonus cell (its extra credit holds the bonus points)")
    return problems


def problems(nb) -> list[str]:
    """Everything wrong with a notebook's declarations (``measure_cells``), each naming the cell and the piece; empty
    when they hold together (or there are none)."""
    from .measure_cells import declarations

    try:
        found = declarations(nb)
    except ValueError as exc:
        return [str(exc)]
    messages, names = [], set()
    for index, data in found:
        label = f"cell {index} ({data.get('name', '?')})"
        try:
            piece = Piece(**data)
        except TypeError as exc:  # a missing or unknown field
            messages.append(f"{label}: {str(exc).replace('Piece.__init__()', 'the declaration')}")
            continue
        if piece.name in names:
            messages.append(f"{label}: another piece is named {piece.name!r}")
        names.add(piece.name)
        messages += [f"{label}: {text}" for text in piece_problems(piece) + _cell_problems(piece, nb, index)]
    return messages


def load(lab: str, course_root: Path | None = None) -> LabMeasure:
    """The declarations of ``lab`` in its instructor notebook, checked.

    Raises:
        SystemExit: no notebook, no declaration, or one that does not hold together (the message says what).
    """
    from .measure_cells import declarations
    from .notebooks import NotebookError, read_notebook

    path = declaration_notebook(lab, course_root)
    try:
        nb = read_notebook(path)
    except NotebookError as exc:
        raise SystemExit(f"{lab}: {exc} (build the lab, or check --course-dir)") from None
    if found := problems(nb):
        raise SystemExit(f"{path}: the measure declarations do not hold together:\n  " + "\n  ".join(found))
    pieces = [Piece(**data) for _, data in declarations(nb)]
    if not pieces:
        raise SystemExit(f"{lab} declares nothing to measure: {path} has no markdown cell tagged 'measure' "
                         "(docs/AUTHORING.md, \"Measured pieces\")")
    setup = [gid for piece in pieces for gid in piece.setup_cells]
    return LabMeasure(lab, list(dict.fromkeys(setup)), pieces)
