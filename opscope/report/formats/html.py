"""HTML: the readiness report of a scan, and the diff report."""
from opscope.report.registry import FunctionReporter


def _scan(result, path):
    from opscope.report.html import write_html
    return write_html(result, path)


def _diff(result, path):
    from opscope.report.diff_html import write_diff_html
    return write_diff_html(result, path)


REPORTERS = [FunctionReporter("html", "report.html", "scan", _scan, "self-contained HTML readiness report"),
             FunctionReporter("html", "diff.html", "diff", _diff, "self-contained HTML diff report")]
