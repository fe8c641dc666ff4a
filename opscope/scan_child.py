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
    sys.exit(child.main(sys.argv[1], analyse=analyse_capture))
