"""SARIF 2.1.0 of a scan's CUDA-API findings, for code-review tools."""
from opscope.report.registry import FunctionReporter


def _scan(result, path):
    from opscope.report.sarif import write_sarif
    findings = result.findings if hasattr(result, "findings") else result
    return write_sarif(findings, path) or path


REPORTERS = [FunctionReporter("sarif", "findings.sarif", "scan", _scan, "SARIF findings")]
