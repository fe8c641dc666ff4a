"""diff.html: a self-contained page (report.css inlined, no network, autoescaped)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from opscope.resources import templates_dir

TEMPLATE = "diff.html.j2"
MAX_ROWS = 2000   # operator rows rendered; diff.xlsx/diff.json hold all of them


@lru_cache(maxsize=1)
def _environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["ms"] = lambda us: "-" if us is None else f"{us / 1000:.3f}"
    env.filters["shapes"] = lambda s: "-" if s is None else ", ".join(str(x) for x in s if x) or "(scalars)"
    return env


def render_diff_html(result) -> str:
    from markupsafe import Markup

    css = Markup((templates_dir() / "report.css").read_text(encoding="utf-8"))
    rows = result.operators[:MAX_ROWS]
    return _environment().get_template(TEMPLATE).render(
        r=result, a=result.a, b=result.b, rows=rows, truncated=len(result.operators) - len(rows), css=css)


def write_diff_html(result, path) -> Path:
    path = Path(path)
    path.write_text(render_diff_html(result), encoding="utf-8")
    return path
