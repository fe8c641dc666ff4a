"""XLSX workbooks (openpyxl): the scan's readiness workbook and the diff workbook."""
from opscope.report.registry import FunctionReporter


def _scan(result, path):
    from opscope.report.xlsx import write_xlsx
    return write_xlsx(result, path)


def _diff(result, path):
    from opscope.report.diff_xlsx import write_diff_xlsx
    return write_diff_xlsx(result, path)


REPORTERS = [FunctionReporter("xlsx", "report.xlsx", "scan", _scan, "readiness workbook, Fixes sheet first"),
             FunctionReporter("xlsx", "diff.xlsx", "diff", _diff, "diff workbook")]
