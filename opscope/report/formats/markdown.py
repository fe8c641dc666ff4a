"""Markdown summary of a scan (for pull requests and chat)."""
from opscope.report.registry import FunctionReporter


def _scan(result, path):
    from opscope.report.markdown import write_markdown
    return write_markdown(result, path)


REPORTERS = [FunctionReporter("md", "report.md", "scan", _scan, "Markdown summary")]
