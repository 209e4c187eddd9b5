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


def plot_rsr(result: dict, path: str | Path) -> Path:
    """`lowbit bench rsr --plot`: Figure 11 and Figure 4 (time vs n, log scales) and RSR++ vs dense per N."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from None
    panels = [p for p in ("fig11", "fig4", "dense") if result.get(p)]
    if not panels:
        raise ValueError("nothing to plot: run with --parts including fig11, fig4 or dense")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, name in zip(axes[0], panels):
        rows = result[name]
        if name == "fig11":
            for kind in ("binary", "ternary"):
                rs = [r for r in rows if r["kind"] == kind]
                ax.plot([r["n"] for r in rs], [r["numpy_rsr_s"] * 1e3 for r in rs], marker="o", label=f"NumPy RSR++ {kind}")
            rs = [r for r in rows if r["kind"] == "binary"]
            ax.plot([r["n"] for r in rs], [r["numpy_dot_s"] * 1e3 for r in rs], marker="s", color="black",
                    label="np.dot float32 (BLAS)")
            if all("numpy_dot_int64_s" in r for r in rs):
                ax.plot([r["n"] for r in rs], [r["numpy_dot_int64_s"] * 1e3 for r in rs], marker="s", color="gray",
                        label="np.dot int64 (authors' baseline)")
            ax.set_title("Figure 11: NumPy")
        elif name == "fig4":
            ns = [r["n"] for r in rows]
            for key, label in (("standard_s", "standard (C++)"), ("numpy_dot_s", "np.dot float32"),
                               ("rsr_s", "RSR (C++)"), ("rsrpp_s", "RSR++ (C++)"), ("rsrpp_i8_s", "RSR++ int8 x"),
                               ("lut_s", "rsr-lut int8 x (not RSR)")):
                if all(key in r for r in rows):
                    ax.plot(ns, [r[key] * 1e3 for r in rows], marker="o", label=label)
            ax.set_title("Figure 4: native, binary, one vector")
        else:
            for shape in dict.fromkeys((r["M"], r["K"]) for r in rows):
                rs = [r for r in rows if (r["M"], r["K"]) == shape]
                line, = ax.plot([r["N"] for r in rs], [r["rsr_gweights_s"] for r in rs], marker="o",
                                label=f"RSR++ {shape[0]}x{shape[1]}")
                ax.plot([r["N"] for r in rs], [r["dense_gweights_s"] for r in rs], marker="s", linestyle="--",
                        color=line.get_color(), label=f"dense {shape[0]}x{shape[1]}")
                if all("lut_gweights_s" in r for r in rs):
                    ax.plot([r["N"] for r in rs], [r["lut_gweights_s"] for r in rs], marker="^", linestyle=":",
                            color=line.get_color(), label=f"rsr-lut {shape[0]}x{shape[1]}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("tokens N")
            ax.set_ylabel("G weights x tokens / s")
            ax.set_title(f"RSR++ / rsr-lut vs dense ternary ({rows[0]['shape']})")
            ax.legend(fontsize=6)
            continue
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n")
        ax.set_ylabel("ms per product")
        ax.legend(fontsize=7)
    fig.suptitle(f"lowbit bench rsr, {result['threads']} thread(s), {result['isa']}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
