"""``opscope fleet``: scan many training jobs (scripts and generated model-zoo jobs) on Ray.

manifest (jobs from YAML) -> zoo (generated training scripts) -> engine (Ray tasks, each the
normal ``opscope scan`` child) -> ``opscope.analysis.fleet`` (aggregation) -> ``opscope.report.fleet_*``.
"""
