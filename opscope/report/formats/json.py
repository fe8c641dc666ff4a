"""JSON: scan.json (the machine-readable source of every other report) and diff.json."""
from opscope.report.registry import FunctionReporter


def _scan(result, path):
    from opscope.report.render import write_json
    return write_json(result, path)


def _diff(result, path):
    from opscope.report.diff_json import write_diff_json
    return write_diff_json(result, path)


REPORTERS = [FunctionReporter("json", "scan.json", "scan", _scan, "scan.json"),
             FunctionReporter("json", "diff.json", "diff", _diff, "diff.json")]
