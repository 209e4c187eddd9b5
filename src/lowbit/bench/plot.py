"""Figures in the style of paper 000's Figures 5-7: attained GEMV bandwidth per shape and format."""
from __future__ import annotations

from pathlib import Path


def plot_gemv(result: dict, path: str | Path) -> Path:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from None
    rows = result["rows"]
    shapes = []
    for r in rows:
        key = (r["model"], r["M"], r["K"])
        if key not in shapes:
            shapes.append(key)
    formats = list(dict.fromkeys(r["format"] for r in rows))
    width = 0.8 / len(formats)
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(shapes) + 2), 4.8))
    for i, fmt in enumerate(formats):
        vals = [next((r["gbps"] for r in rows if (r["model"], r["M"], r["K"]) == s and r["format"] == fmt), 0) for s in shapes]
        ax.bar([x + (i - (len(formats) - 1) / 2) * width for x in range(len(shapes))], vals, width, label=fmt)
    roofs = [max(r["roof_gbps"] for r in rows if (r["model"], r["M"], r["K"]) == s) for s in shapes]
    ax.plot(range(len(shapes)), roofs, color="black", linestyle="--", marker="_", markersize=20, linewidth=1,
            label="read bandwidth measured beside each shape")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"{m}x{k}\n{model}" for model, m, k in shapes], fontsize=7)
    ax.set_ylabel("GB/s of packed weights")
    mode = "GEMV" if result["n_tokens"] == 1 else f"GEMM N={result['n_tokens']}"
    ax.set_title(f"lowbit {mode}, {result['threads']} thread(s), {result['isa']}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
