"""Draw the figures the lab notebooks show into ``assets/`` (matplotlib only; no data, no downloads).

Usage (from the repository root)::

    python scripts/make_assets.py            # (re)draw every figure
    python scripts/make_assets.py roofline   # only the named figures

Every figure is ours and drawn from scratch here; the output is deterministic (no timestamps in the PNG
metadata), so re-running the script without changing it leaves ``assets/`` unchanged.

Figures:
    roofline.png           the roofline model: memory-bound slope, compute roof, ridge point, two operators.
    kernel_fusion_1.png    the factory (compute units) and the warehouse (HBM) joined by a narrow road.
    kernel_fusion_2.png    three unfused elementwise kernels: every one ships its data out and back.
    kernel_fusion_3.png    the same three operations fused into one kernel: one trip in, one trip out.
    flash_attn_tiling.png  FlashAttention's tiling: Q, K, V blocks stream through SRAM; S and P never reach HBM.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
DPI = 150
PNG_METADATA = {"Software": None}  # no matplotlib version string: the bytes do not change between runs

COMPUTE_COLOR = "#f4a261"  # the factory: SMs, registers, shared memory (SRAM)
MEMORY_COLOR = "#457b9d"  # the warehouse: HBM (global memory)
DATA_COLOR = "#2a9d8f"
TEXT_COLOR = "#1d3557"


def _save(fig, name: str) -> Path:
    ASSETS_DIR.mkdir(parents=True, exist_ok=True)
    path = ASSETS_DIR / name
    fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata=PNG_METADATA)
    plt.close(fig)
    return path


def _box(ax, x, y, w, h, text, color, fontsize=11, text_color="white", alpha=1.0):
    """A rounded box with centred text; (x, y) is the lower-left corner in axes data units."""
    ax.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", facecolor=color,
                       edgecolor=TEXT_COLOR, linewidth=1.2, alpha=alpha)
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color,
            fontweight="bold", wrap=True)


def _arrow(ax, start, end, color=TEXT_COLOR, width=2.0, style="-|>", text=None, text_offset=(0, 0.12),
           fontsize=9, connectionstyle="arc3"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=16, color=color, linewidth=width,
                                 connectionstyle=connectionstyle))
    if text:
        mx, my = (start[0] + end[0]) / 2 + text_offset[0], (start[1] + end[1]) / 2 + text_offset[1]
        ax.text(mx, my, text, ha="center", va="center", fontsize=fontsize, color=color)


def _blank_axes(width, height, xlim, ylim):
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


def draw_roofline() -> Path:
    """The roofline model with illustrative numbers (peak 100 TFLOP/s, 2 TB/s: ridge at 50 FLOP/byte)."""
    peak_tflops, bandwidth_tb_s = 100.0, 2.0
    ridge = peak_tflops / bandwidth_tb_s  # FLOP/byte
    intensity = np.logspace(-1, 4, 400)
    attainable = np.minimum(peak_tflops, bandwidth_tb_s * intensity)

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ax.loglog(intensity, attainable, color=TEXT_COLOR, linewidth=2.5, label="roofline: min(peak, BW x AI)")
    ax.axvspan(intensity[0], ridge, color=MEMORY_COLOR, alpha=0.12)
    ax.axvspan(ridge, intensity[-1], color=COMPUTE_COLOR, alpha=0.15)
    ax.axvline(ridge, color="grey", linestyle="--", linewidth=1)
    ax.annotate(f"ridge point\nAI = peak / BW = {ridge:.0f} FLOP/byte", xy=(ridge, peak_tflops),
                xytext=(ridge * 3.0, peak_tflops * 0.12), fontsize=9,
                arrowprops=dict(arrowstyle="->", color="grey"))
    ax.text(0.25, 2.2, "memory-bound\nperformance = BW x AI", fontsize=10, color=MEMORY_COLOR, rotation=0)
    ax.text(250, 140, "compute-bound\nperformance = peak FLOP/s", fontsize=10, color="#b5651d")

    for name, ai, marker in (("elementwise op\n(AI about 0.1 to 1)", 0.25, "o"), ("large GEMM\n(AI grows with N)", 800, "s")):
        perf = min(peak_tflops, bandwidth_tb_s * ai)
        ax.plot([ai], [perf], marker=marker, markersize=9, color=DATA_COLOR, zorder=5)
        ax.annotate(name, xy=(ai, perf), xytext=(ai * 1.5, perf * 0.25), fontsize=9, color=DATA_COLOR)

    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable performance (TFLOP/s)")
    ax.set_title("The roofline model (illustrative GPU: 100 TFLOP/s, 2 TB/s)")
    ax.set_ylim(0.1, 400)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="lower right", fontsize=9)
    return _save(fig, "roofline.png")


def draw_factory_warehouse() -> Path:
    """Compute units as a factory, HBM as a warehouse, memory bandwidth as the road between them."""
    fig, ax = _blank_axes(9, 3.2, (0, 12), (0, 4))
    _box(ax, 0.2, 0.7, 3.4, 2.6, "Warehouse\n(HBM, global memory)\nlarge: tens of GB\nfar from compute",
         MEMORY_COLOR, fontsize=10.5)
    _box(ax, 8.4, 0.7, 3.4, 2.6, "Factory\n(SMs: registers,\nshared memory)\nsmall, very fast",
         COMPUTE_COLOR, fontsize=10.5, text_color=TEXT_COLOR)
    ax.add_patch(Rectangle((3.7, 1.75), 4.6, 0.5, facecolor="#d9d9d9", edgecolor=TEXT_COLOR))
    _arrow(ax, (3.8, 2.5), (8.3, 2.5), color=DATA_COLOR, text="load inputs", text_offset=(0, 0.25))
    _arrow(ax, (8.3, 1.5), (3.8, 1.5), color=DATA_COLOR, text="store outputs", text_offset=(0, -0.25))
    ax.text(6.0, 2.0, "the road: memory bandwidth (TB/s)", ha="center", va="center", fontsize=9,
            color=TEXT_COLOR)
    ax.set_title("Compute is the factory, memory is the warehouse", fontsize=12, color=TEXT_COLOR)
    return _save(fig, "kernel_fusion_1.png")


def draw_unfused() -> Path:
    """Three elementwise kernels, each a round trip between the warehouse and the factory."""
    fig, ax = _blank_axes(9, 4.0, (0, 12), (0, 5))
    _box(ax, 0.3, 0.4, 11.4, 1.1, "Warehouse (HBM):   x   ->   a = cos(x)   ->   b = a * 2   ->   y = b + 1",
         MEMORY_COLOR, fontsize=10.5)
    labels = ("kernel 1\na = cos(x)", "kernel 2\nb = a * 2", "kernel 3\ny = b + 1")
    for i, label in enumerate(labels):
        x0 = 0.8 + i * 3.9
        _box(ax, x0, 3.0, 2.6, 1.3, label, COMPUTE_COLOR, fontsize=10, text_color=TEXT_COLOR)
        _arrow(ax, (x0 + 0.5, 1.55), (x0 + 0.5, 2.95), color=DATA_COLOR, text="read", text_offset=(-0.35, 0))
        _arrow(ax, (x0 + 2.1, 2.95), (x0 + 2.1, 1.55), color="#e76f51", text="write", text_offset=(0.4, 0))
    ax.set_title("Unfused: 3 kernel launches, 3 reads + 3 writes of the whole tensor", fontsize=12,
                 color=TEXT_COLOR)
    return _save(fig, "kernel_fusion_2.png")


def draw_fused() -> Path:
    """The same three operations in one kernel: intermediates stay in registers."""
    fig, ax = _blank_axes(9, 4.0, (0, 12), (0, 5))
    _box(ax, 0.3, 0.4, 11.4, 1.1, "Warehouse (HBM):   x   ->   y", MEMORY_COLOR, fontsize=10.5)
    _box(ax, 2.5, 3.0, 7.0, 1.3, "one fused kernel:  y = cos(x) * 2 + 1\n(a and b live in registers only)",
         COMPUTE_COLOR, fontsize=10, text_color=TEXT_COLOR)
    _arrow(ax, (4.0, 1.55), (4.0, 2.95), color=DATA_COLOR, text="read x once", text_offset=(-0.8, 0))
    _arrow(ax, (8.0, 2.95), (8.0, 1.55), color="#e76f51", text="write y once", text_offset=(0.85, 0))
    ax.set_title("Fused: 1 kernel launch, 1 read + 1 write: about 3x less memory traffic", fontsize=12,
                 color=TEXT_COLOR)
    return _save(fig, "kernel_fusion_3.png")


def draw_flash_attn_tiling() -> Path:
    """Q row blocks meet K/V column blocks in SRAM; only O (and the softmax statistics) is written to HBM."""
    fig, ax = _blank_axes(10.5, 5.2, (0, 14.2), (0, 7.2))
    n_blocks = 4
    # Q: a tall matrix split into row blocks (outer loop i).
    for i in range(n_blocks):
        color = COMPUTE_COLOR if i == 1 else "#e9ecef"
        ax.add_patch(Rectangle((0.5, 5.5 - (i + 1) * 1.0), 1.0, 1.0, facecolor=color, edgecolor=TEXT_COLOR))
        ax.text(0.3, 5.0 - i * 1.0, f"Q{i + 1}", ha="right", va="center", fontsize=9)
    ax.text(1.0, 5.75, "Q (N x d)", ha="center", fontsize=10, color=TEXT_COLOR)
    # K^T: a wide matrix split into column blocks (inner loop j).
    for j in range(n_blocks):
        color = DATA_COLOR if j == 2 else "#e9ecef"
        ax.add_patch(Rectangle((2.5 + j * 1.0, 5.6), 1.0, 1.0, facecolor=color, edgecolor=TEXT_COLOR))
        ax.text(3.0 + j * 1.0, 6.8, f"K{j + 1}ᵀ", ha="center", fontsize=9)
    ax.text(6.9, 6.1, "Kᵀ (d x N)", ha="left", va="center", fontsize=10, color=TEXT_COLOR)
    # S = Q K^T: only one tile exists at a time, in SRAM.
    for i in range(n_blocks):
        for j in range(n_blocks):
            live = (i == 1 and j == 2)
            ax.add_patch(Rectangle((2.5 + j * 1.0, 5.5 - (i + 1) * 1.0), 1.0, 1.0,
                                   facecolor=COMPUTE_COLOR if live else "white", edgecolor="#adb5bd",
                                   linestyle="-" if live else ":", alpha=1.0))
    ax.text(4.5, 1.15, "S = QKᵀ / sqrt(d) (N x N):\nnever stored in HBM; one tile S_ij\nat a time lives in SRAM",
            ha="center", va="center", fontsize=9, color=TEXT_COLOR)
    # SRAM box with the per-tile work.
    _box(ax, 8.0, 2.2, 5.8, 3.6,
         "SRAM (on chip), tile (i, j):\n"
         "S_ij = Q_i K_jᵀ / sqrt(d)\n"
         "m_new = max(m_i, rowmax(S_ij))\n"
         "P_ij = exp(S_ij - m_new)\n"
         "l_i = exp(m_i - m_new) l_i + rowsum(P_ij)\n"
         "O_i = exp(m_i - m_new) O_i + P_ij V_j\n"
         "m_i = m_new",
         COMPUTE_COLOR, fontsize=9.5, text_color=TEXT_COLOR)
    _arrow(ax, (6.9, 4.2), (7.95, 4.2), color=DATA_COLOR)
    ax.text(7.3, 4.75, "load\nQ_i, K_j, V_j", ha="center", va="center", fontsize=8, color=DATA_COLOR)
    _box(ax, 8.0, 0.2, 5.8, 1.3, "HBM: after the last K/V block,\nwrite O_i / l_i once", MEMORY_COLOR,
         fontsize=9.5)
    _arrow(ax, (10.9, 2.15), (10.9, 1.55), color="#e76f51")
    ax.set_title("FlashAttention: tiles of S and P stay on chip; HBM sees Q, K, V read and O written",
                 fontsize=12, color=TEXT_COLOR)
    return _save(fig, "flash_attn_tiling.png")


FIGURES = {
    "roofline": draw_roofline,
    "kernel_fusion_1": draw_factory_warehouse,
    "kernel_fusion_2": draw_unfused,
    "kernel_fusion_3": draw_fused,
    "flash_attn_tiling": draw_flash_attn_tiling,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"figures to draw (default: all): {', '.join(sorted(FIGURES))}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(FIGURES))
    if unknown:
        parser.error(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(sorted(FIGURES))}")
    for name in args.names or sorted(FIGURES):
        path = FIGURES[name]()
        print(f"wrote {path.relative_to(ASSETS_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
