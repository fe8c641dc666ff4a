"""diff.xlsx: one sheet per question (operators, inserted, fallbacks, steps, ranks)."""
from __future__ import annotations

from pathlib import Path

from opscope.report.cells import set_cell


def _sheet(wb, title, headers, rows):
    """Every cell, headers included (run labels come from the command line), via ``set_cell``."""
    from openpyxl.styles import Font
    from openpyxl.utils import get_column_letter

    ws = wb.create_sheet(title)
    for c, header in enumerate(headers, start=1):
        set_cell(ws.cell(row=1, column=c), header)
        ws.cell(row=1, column=c).font = Font(bold=True)
    for r, row in enumerate(rows, start=2):
        for c, value in enumerate(row, start=1):
            set_cell(ws.cell(row=r, column=c), _value(value))
    ws.freeze_panes = "A2"
    if ws.max_row > 1:
        ws.auto_filter.ref = ws.dimensions
    for i, h in enumerate(headers, start=1):
        width = max([len(str(ws.cell(row=1, column=i).value or ""))]
                    + [len(str(c.value or "")) for c in ws[get_column_letter(i)][1:200]])
        ws.column_dimensions[get_column_letter(i)].width = min(max(width + 2, 8), 60)
    return ws


def _value(v):
    if isinstance(v, (list, tuple, dict)):
        return str(v)
    return v


def write_diff_xlsx(result, path) -> Path:
    from openpyxl import Workbook

    path = Path(path)
    wb = Workbook()
    wb.remove(wb.active)
    a, b = result.a, result.b
    _sheet(wb, "Summary", ["", a["label"], b["label"]], [
        ["input", a["path"], b["path"]], ["format", a["format"], b["format"]], ["device", a["device"], b["device"]],
        ["rank", a["rank"], b["rank"]],
        ["avg step ms", *[(s["step"]["avg_step_us"] or 0) / 1000 for s in (a, b)]],
        ["FPS", a["step"]["fps"], b["step"]["fps"]],
        ["warm-up steps excluded", ", ".join(map(str, a["step"]["warmup_steps"])),
         ", ".join(map(str, b["step"]["warmup_steps"]))],
        ["operator calls / step", a["op_calls_per_step"], b["op_calls_per_step"]],
        ["host time / step ms", a["host_time_per_step_us"] / 1000, b["host_time_per_step_us"] / 1000],
        ["device time / step ms", a["device_time_per_step_us"] / 1000, b["device_time_per_step_us"] / 1000],
    ] + [["note", n, ""] for n in result.notes])
    _sheet(wb, "Operators", ["operator", "phase", "status", "calls A", "calls B", "time A ms", "time B ms",
                             "delta ms", "host A ms", "host B ms", "device A ms", "device B ms",
                             "shapes A", "shapes B", "dtypes A", "dtypes B", "changes", "parent", "source"],
           [[r.name, r.phase, r.status, r.calls_a, r.calls_b, r.time_a_us / 1000, r.time_b_us / 1000,
             r.delta_us / 1000, r.host_a_us / 1000, r.host_b_us / 1000, r.device_a_us / 1000, r.device_b_us / 1000,
             r.input_shapes_a, r.input_shapes_b, r.dtypes_a, r.dtypes_b, "; ".join(r.changes), r.parent, r.source]
            for r in result.operators])
    _sheet(wb, "Only in A", ["operator", "calls/step", "time ms", "phases", "under"],
           [[i["name"], i["calls"], i["time_us"] / 1000, ", ".join(i["phases"]), i["under"]] for i in result.only_a])
    _sheet(wb, "Only in B", ["operator", "calls/step", "time ms", "phases", "under"],
           [[i["name"], i["calls"], i["time_us"] / 1000, ", ".join(i["phases"]), i["under"]] for i in result.only_b])
    _sheet(wb, "Inserted", ["side", "kind", "name", "calls/step", "host ms", "device ms", "triggered by"],
           [[i["side"], i["kind"], i["name"], i["calls"], i["host_us"] / 1000, i["device_us"] / 1000,
             ", ".join(i["triggered_by"])] for i in result.inserted])
    _sheet(wb, "CPU fallbacks", ["side", "operator", "count", "evidence"],
           [[f["side"], f["op"], f["count"], f["evidence"]] for f in result.fallbacks])
    _sheet(wb, "dtype changes", ["operator", "phase", "arg", "A", "B"],
           [[d["name"], d["phase"], d["arg"], d["a"], d["b"]] for d in result.dtype_changes])
    _sheet(wb, "Call counts", ["operator", "phase", "calls A", "calls B"],
           [[c["name"], c["phase"], c["calls_a"], c["calls_b"]] for c in result.call_count_changes])
    _sheet(wb, "Steps", ["run", "step", "duration ms", "warm-up"],
           [[side["label"], s["index"], s["duration_us"] / 1000, s["warmup"]] for side in (a, b)
            for s in side["step"]["steps"]])
    rank_rows = []
    for key, ranks in result.ranks.items():
        label = (a if key == "a" else b)["label"]
        for r in ranks["ranks"]:
            rank_rows.append([label, r["rank"], (r["avg_step_us"] or 0) / 1000, r["device_time_us"] / 1000,
                              r["host_time_us"] / 1000, r["rank"] == ranks.get("straggler")])
    _sheet(wb, "Ranks", ["run", "rank", "avg step ms", "device ms", "host ms", "straggler"], rank_rows)
    wb.save(path)
    return path
