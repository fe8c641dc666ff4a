"""Report charts drawn with matplotlib and returned as ``data:`` URIs.

The HTML report must open from disk with no network, so every chart is embedded as
base64 SVG inside an ``<img>`` (an image-SVG can never run script, whatever an
operator name contains).  matplotlib is imported lazily and used through
``matplotlib.figure.Figure`` with its own SVG canvas: pyplot and the global backend are
never touched, so a notebook keeps its backend (and its open figures) after a report.

Only charts that add something to the tables are drawn: verdict time per phase (the
verdict table has no phase split) and the sizes of dynamic dimensions step by step.
"""
from __future__ import annotations

import base64
import io

from opscope.model import VERDICTS, ScanResult
from opscope.report.view import VERDICT_COLOURS, op_time_us, verdict_of

MAX_LABEL = 48


def _figure(width: float, height: float):
    """A stand-alone figure: no pyplot, no backend switch, nothing registered globally."""
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height))


def _to_data_uri(fig) -> str:
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    FigureCanvasSVG(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _short(label: str) -> str:
    """A chart label: no control characters (a font has no glyph for them), cut to MAX_LABEL."""
    label = "".join(c if c.isprintable() else " " for c in label)
    return label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"


PHASES = ("forward", "backward", "optimizer", "other")


def time_by_phase(result: ScanResult) -> str | None:
    """Stacked horizontal bars: per phase (forward, backward, optimizer, other), the share of
    operator time by verdict.  None when nothing was timed."""
    total = sum(op_time_us(op) for op in result.operators)
    if not total:
        return None
    table: dict[str, dict[str, float]] = {}
    for op in result.operators:
        t = op_time_us(op)
        if t > 0:
            phase = op.phase if op.phase in PHASES else "other"
            row = table.setdefault(phase, {})
            row[verdict_of(op)] = row.get(verdict_of(op), 0.0) + t / total * 100
    phases = [p for p in PHASES if p in table][::-1]
    fig = _figure(7, 0.5 * len(phases) + 1.1)
    ax = fig.add_subplot()
    left = [0.0] * len(phases)
    for verdict in VERDICTS:
        values = [table[p].get(verdict, 0.0) for p in phases]
        if any(values):
            ax.barh(phases, values, left=left, color=VERDICT_COLOURS[verdict], label=verdict)
            left = [a + b for a, b in zip(left, values, strict=True)]
    for y, value in enumerate(left):
        ax.text(value, y, f" {value:.1f}%", va="center", fontsize=8)
    ax.set_xlabel("% of operator time")
    ax.set_xlim(0, max(left) * 1.15 + 1)
    ax.set_title("Operator time by phase and verdict")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return _to_data_uri(fig)


def _dim_values(shapes, arg: int, dim: int | None) -> list:
    """Size of ``arg``'s dimension ``dim`` in each signature (its rank when dim is None)."""
    values = []
    for signature in shapes or []:
        try:
            shape = signature[arg]
            values.append(len(shape) if dim is None else shape[dim])
        except (IndexError, KeyError, TypeError):
            continue
    return values


def _as_int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _chart_dim(varying_dims):
    """The dimension to plot: the first sized one, else the first rank change."""
    dims = [d for d in varying_dims or [] if isinstance(d, dict) and _as_int(d.get("arg")) is not None]
    sized = [d for d in dims if _as_int(d.get("dim")) is not None]
    if sized:
        return sized[0]["arg"], sized[0]["dim"], f"arg{sized[0]['arg']}.dim{sized[0]['dim']}"
    if dims:
        return dims[0]["arg"], None, f"arg{dims[0]['arg']} rank"
    return None


def dynamic_shapes_per_step(result: ScanResult, limit: int = 8) -> str | None:
    """Size of each dynamic op's varying dimension in every step it ran."""
    series, seen = [], set()
    for ds in result.dynamic_shapes:
        chosen = _chart_dim(ds.varying_dims)
        label = f"{ds.op} {chosen[2]}" if chosen else f"{ds.op} (#shapes)"
        if label in seen:
            continue
        points = []
        for step, shapes in (ds.shapes_per_step or {}).items():
            try:
                x = int(step)
            except (TypeError, ValueError):
                continue
            ys = _dim_values(shapes, chosen[0], chosen[1]) if chosen else [len(shapes or [])]
            points += [(x, y) for y in ys if isinstance(y, (int, float))]
        if points:
            seen.add(label)
            series.append((_short(label), sorted(set(points))))
        if len(series) >= limit:
            break
    if not series:
        return None
    from matplotlib.ticker import MaxNLocator
    fig = _figure(7, 3.2)
    ax = fig.add_subplot()
    width = 0.6 / max(1, len(series))  # side by side within a step, like grouped bars
    for i, (label, points) in enumerate(series):
        offset = (i - (len(series) - 1) / 2) * width
        ax.scatter([p[0] + offset for p in points], [p[1] for p in points], s=18, label=label)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("dimension size")
    ax.set_title("Shapes per step of dynamic operators")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return _to_data_uri(fig)


CHARTS = {"time_by_phase": time_by_phase, "dynamic_shapes": dynamic_shapes_per_step}


def all_charts(result: ScanResult) -> dict[str, str | None]:
    """Every chart; one that cannot be drawn from odd scan data is left out with a warning,
    because a missing chart must never cost the user the whole report."""
    import warnings

    charts = {}
    for name, draw in CHARTS.items():
        try:
            charts[name] = draw(result)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            warnings.warn(f"opscope: chart {name} left out of the report: {exc!r}", RuntimeWarning, stacklevel=2)
            charts[name] = None
    return charts
