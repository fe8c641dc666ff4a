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
    for i, _header in enumerate(headers, start=1):
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
    _sheet(wb, "Only in A", ["operator", "calls/step", "time ms", "phases", "under", "likely cause"],
           [[i["name"], i["calls"], i["time_us"] / 1000, ", ".join(i["phases"]), i["under"], i.get("cause")]
            for i in result.only_a])
    _sheet(wb, "Only in B", ["operator", "calls/step", "time ms", "phases", "under", "likely cause"],
           [[i["name"], i["calls"], i["time_us"] / 1000, ", ".join(i["phases"]), i["under"], i.get("cause")]
            for i in result.only_b])
    _sheet(wb, "Inserted", ["side", "kind", "name", "calls/step", "host ms", "device ms", "triggered by"],
           [[i["side"], i["kind"], i["name"], i["calls"], i["host_us"] / 1000, i["device_us"] / 1000,
             ", ".join(i["triggered_by"])] for i in result.inserted])
    _sheet(wb, "CPU fallbacks", ["side", "operator", "count", "evidence"],
           [[f["side"], f["op"], f["count"], f["evidence"]] for f in result.fallbacks])
    _sheet(wb, "dtype changes", ["operator", "phase", "arg", "A", "B", "signatures", "likely cause"],
           [[d["name"], d["phase"], d["arg"], d["a"], d["b"], d.get("signatures", 1), d.get("cause")]
            for d in result.dtype_changes])
    _sheet(wb, "Transfers", ["run", "operator", "shape", "dtype", "calls/step", "device ms", "source"],
           [[tr["side"], it["name"], str(it["shape"]), it["dtype"], it["calls"], it["device_us"] / 1000, it["source"]]
            for tr in result.transfers for it in tr["items"]])
    _sheet(wb, "Folded", ["run", "parent", "folded operator", "calls/step", "time ms"],
           [[f["side"], f["parent"], f["name"], f["calls"], f["time_us"] / 1000] for f in result.folded])
    _sheet(wb, "Call counts", ["operator", "phase", "calls A", "calls B"],
           [[c["name"], c["phase"], c["calls_a"], c["calls_b"]] for c in result.call_count_changes])
    _sheet(wb, "Steps", ["run", "step", "duration ms", "warm-up"],
           [[side["label"], s["index"], s["duration_us"] / 1000, s["warmup"]] for side in (a, b)
            for s in side["step"]["steps"]])
    _sheet(wb, "Device split", ["run", "host step ms", "preparing ms", "device step ms", "computing ms",
                                "communication ms", "overlapped ms", "comm not overlapped ms", "free ms", "copies ms"],
           [[side["label"], *((side["step"]["device_split_us"].get(k) or 0) / 1000 for k in (
               "host_span_us", "preparing_us", "device_span_us", "computing_us", "communication_us",
               "overlapped_us", "communication_not_overlapped_us", "free_us", "transfer_us"))]
            for side in (a, b) if side["step"].get("device_split_us")])
    _sheet(wb, "Collectives", ["run", "collective", "operator", "calls/step", "time ms/step", "bytes/step",
                               "algorithm GB/s"],
           [[side["label"], c["name"], c["op"], c["calls"], c["time_us"] / 1000, c.get("bytes"),
             c.get("algorithm_bandwidth_gb_s")] for side in (a, b) for c in side.get("collectives") or []])
    rank_rows = []
    ms = lambda v: None if v is None else v / 1000   # noqa: E731
    for key, ranks in result.ranks.items():
        label = (a if key == "a" else b)["label"]
        for r in ranks["ranks"]:
            rank_rows.append([label, r["rank"], ms(r["host_step_us"]), ms(r["device_step_us"]), ms(r["computing_us"]),
                              ms(r["communication_us"]), ms(r["wait_us"]), ms(r["late_us"]), ms(r["free_us"]),
                              r["rank"] == ranks.get("slow_rank"), ranks.get("slow_rank_reason")])
    _sheet(wb, "Ranks", ["run", "rank", "host step ms", "device step ms", "computing ms", "communication ms",
                         "wait ms", "late arrival ms", "free ms", "slow rank", "why"], rank_rows)
    wb.save(path)
    return path
