"""Entry point of the child process of ``opscope scan``: capture, then analyse in place.

``python -m opscope.scan_child CONFIG.json``.  The capture half is ``opscope.capture.child``;
the analysis half is ``opscope.pipeline`` (here, where torch is already imported, so the
parent only reads scan.json).  Keeping this wiring outside ``capture`` keeps capture free
of imports of analysis and report.
"""
import sys

from opscope.capture import child
from opscope.pipeline import analyse_capture

if __name__ == "__main__":
    if sys.argv[1] == "--plan-fd":   # started ahead of its plan (capture.processes.EarlyChild)
        config = child.await_plan(int(sys.argv[2]))
        if config is None:   # the command ended before the scan began
            sys.exit(0)
    else:
        config = sys.argv[1]
    sys.exit(child.main(config, analyse=analyse_capture))
