"""Report charts drawn with matplotlib and returned as ``data:`` URIs.

The HTML report must open from disk with no network, so every chart is embedded as
base64 SVG inside an ``<img>`` (an image-SVG can never run script, whatever an
operator name contains).  matplotlib is imported lazily and forced onto Agg so this
works on headless CI machines.
"""
from __future__ import annotations

import base64
import io

from opscope.model import VERDICTS, ScanResult
from opscope.report.view import VERDICT_COLOURS, op_time_us, verdict_of, verdict_time_share

MAX_LABEL = 48


def _pyplot():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _to_data_uri(fig) -> str:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _short(label: str) -> str:
    return label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"


def time_by_verdict(result: ScanResult) -> str | None:
    """Horizontal bar: share of operator time per verdict. None when nothing was timed."""
    shares = verdict_time_share(result)
    items = [(v, shares[v]) for v in VERDICTS if shares.get(v)]
    if not items:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 0.45 * len(items) + 0.8))
    names = [v for v, _ in items][::-1]
    values = [s * 100 for _, s in items][::-1]
    ax.barh(names, values, color=[VERDICT_COLOURS[v] for v in names])
    for y, value in enumerate(values):
        ax.text(value, y, f" {value:.1f}%", va="center", fontsize=8)
    ax.set_xlabel("% of operator time")
    ax.set_xlim(0, max(values) * 1.2 + 1)
    ax.set_title("Time by verdict")
    ax.spines[["top", "right"]].set_visible(False)
    return _to_data_uri(fig)


def top_operators(result: ScanResult, limit: int = 15) -> str | None:
    """Horizontal bar: the operators (by name) that cost the most time, coloured by verdict."""
    by_name: dict[str, list] = {}
    for op in result.operators:
        entry = by_name.setdefault(op.name, [0.0, verdict_of(op)])
        entry[0] += op_time_us(op)
    items = sorted(((n, t, v) for n, (t, v) in by_name.items() if t > 0), key=lambda x: -x[1])[:limit]
    if not items:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(items) + 0.9))
    items = items[::-1]
    ax.barh([_short(n) for n, _, _ in items], [t / 1000 for _, t, _ in items],
            color=[VERDICT_COLOURS.get(v, "#999") for _, _, v in items])
    ax.set_xlabel("time (ms, all captured steps)")
    ax.set_title(f"Top {len(items)} operators by time")
    ax.tick_params(axis="y", labelsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    return _to_data_uri(fig)


def _dim_values(shapes, arg: int, dim: int) -> list:
    values = []
    for signature in shapes or []:
        try:
            values.append(signature[arg][dim])
        except (IndexError, KeyError, TypeError):
            continue
    return values


def dynamic_shapes_per_step(result: ScanResult, limit: int = 8) -> str | None:
    """Value of each dynamic op's first varying dimension in every step it ran."""
    series = []
    for ds in result.dynamic_shapes[:limit]:
        per_step = ds.shapes_per_step or {}
        dims = ds.varying_dims or []
        first = dims[0] if dims and isinstance(dims[0], dict) else None
        points = []
        for step, shapes in per_step.items():
            try:
                x = int(step)
            except (TypeError, ValueError):
                continue
            if first is not None:
                ys = _dim_values(shapes, int(first.get("arg", 0)), int(first.get("dim", 0)))
            else:
                ys = [len(shapes or [])]
            points += [(x, y) for y in ys if isinstance(y, (int, float))]
        if points:
            label = f"{ds.op} arg{first.get('arg')}.dim{first.get('dim')}" if first else f"{ds.op} (#shapes)"
            series.append((_short(label), sorted(points)))
    if not series:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for label, points in series:
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xlabel("step")
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("dimension size")
    ax.set_title("Shapes per step of dynamic operators")
    ax.legend(fontsize=7, loc="best")
    ax.spines[["top", "right"]].set_visible(False)
    return _to_data_uri(fig)


def all_charts(result: ScanResult) -> dict[str, str | None]:
    return {
        "time_by_verdict": time_by_verdict(result),
        "top_operators": top_operators(result),
        "dynamic_shapes": dynamic_shapes_per_step(result),
    }
