"""fleet.json / fleet.html / fleet.xlsx from the document of ``opscope.analysis.fleet.aggregate_fleet``."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from opscope.atomic import write_atomic
from opscope.resources import templates_dir

TEMPLATE = "fleet.html.j2"


def write_fleet_json(doc: dict, path: Path) -> Path:
    return write_atomic(path, json.dumps(doc, indent=1, ensure_ascii=False, default=str))


@lru_cache(maxsize=1)
def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=True,
                              trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)


def render_fleet_html(doc: dict) -> str:
    from markupsafe import Markup

    css = Markup((templates_dir() / "report.css").read_text(encoding="utf-8"))
    shown = shown_lines(doc)
    upgrades = [u for u in doc["upgrades"] if u["unblocked_models"] or u["operators_fixed"]
                or u["newly_blocked_models"] or u["operators_newly_blocking"]]
    return _environment().get_template(TEMPLATE).render(f=doc, s=doc["summary"], css=css, shown=shown,
                                                        folded=[l for l in doc["lines"] if l not in shown],
                                                        upgrades=upgrades)


def shown_lines(doc: dict) -> list[str]:
    """The versions worth a column: the oldest, each where some model or operator changes, the newest."""
    lines = doc["lines"]

    def state(line):
        return (tuple((m["model"], (m["per_line"].get(line) or {}).get("score"),
                       (m["per_line"].get(line) or {}).get("ready")) for m in doc["models"]),
                tuple((o["op"], o["per_line"][line]["blocks"]) for o in doc["operators"]))

    shown = [lines[0]] if lines else []
    for prev, line in zip(lines, lines[1:], strict=False):
        if state(line) != state(prev) or line == lines[-1]:
            shown.append(line)
    return shown


def write_fleet_html(doc: dict, path: Path) -> Path:
    path = Path(path)
    path.write_text(render_fleet_html(doc), encoding="utf-8")
    return path


def write_fleet_xlsx(doc: dict, path: Path) -> Path:
    from openpyxl import Workbook
    from openpyxl.styles import Font, PatternFill
    from openpyxl.utils import get_column_letter

    lines, versions = doc["lines"], doc["versions"]
    newest = lines[-1]
    wb = Workbook()
    bold, fill = Font(bold=True), PatternFill("solid", fgColor="F6F8FA")

    def sheet(ws, header, rows):
        ws.append(header)
        for cell in ws[1]:
            cell.font, cell.fill = bold, fill
        for row in rows:
            ws.append(["" if v is None else v for v in row])
        ws.freeze_panes = "A2"
        ws.auto_filter.ref = f"A1:{get_column_letter(len(header))}{max(1, ws.max_row)}"
        for i, _ in enumerate(header, 1):
            width = max((len(str(c.value or "")) for c in ws[get_column_letter(i)][:200]), default=8)
            ws.column_dimensions[get_column_letter(i)].width = min(60, max(8, width + 2))

    ws = wb.active
    ws.title = "operators"
    sheet(ws, ["operator", f"verdict {versions[newest]}"] + [f"blocks {l}" for l in lines]
          + ["time share", "substitute", f"models {newest}", "first supported in"],
          [[o["op"], o["per_line"][newest]["verdict"]] + [o["per_line"][l]["blocks"] for l in lines]
           + [o["time_share"], o["substitute"], ", ".join(o["per_line"][newest]["models"]), o["first_supported_in"]]
           for o in doc["operators"]])
    sheet(wb.create_sheet("models"), ["model"] + [f"score {l}" for l in lines] + [f"ready {l}" for l in lines]
          + ["dynamic root causes", "scan target", "script"],
          [[m["model"]] + [m["per_line"].get(l, {}).get("score") for l in lines]
           + ["yes" if m["per_line"].get(l, {}).get("ready") else "no" for l in lines]
           + [m["dynamic_root_causes"], m["scan_target"], m["script"]] for m in doc["models"]])
    sheet(wb.create_sheet("upgrades"), ["from", "to", "models unblocked", "unblocked models", "operators fixed",
                                        "newly blocked models"],
          [[u["from_version"], u["to_version"], len(u["unblocked_models"]), ", ".join(u["unblocked_models"]),
            ", ".join(f"{o['op']} ({len(o['blocked_models'])})" for o in u["operators_fixed"]),
            ", ".join(u["newly_blocked_models"])] for u in doc["upgrades"]])
    sheet(wb.create_sheet("dynamic shapes"), ["kind", "models", "root causes", "model list", "examples"],
          [[r["kind"], len(r["models"]), r["root_causes"], ", ".join(r["models"]),
            "; ".join(f"{e['model']}: {e['source']}" for e in r["examples"])] for r in doc["dynamic_roots"]])
    sheet(wb.create_sheet("jobs"), ["job", "kind", "model", "status", "reason", "readiness score", "seconds",
                                    "attempts", "run folder"],
          [[j["name"], j["kind"], j["model"], j["status"], j["reason"], j["readiness_score"], j["duration_s"],
            j["attempts"], j["run_dir"]] for j in doc["jobs"]])
    path = Path(path)
    wb.save(path)
    return path


# The fleet reports ``opscope fleet --format`` chooses from (fleet.json is always written): name -> (file, writer).
FLEET_REPORTS = {"html": ("fleet.html", write_fleet_html), "xlsx": ("fleet.xlsx", write_fleet_xlsx)}
