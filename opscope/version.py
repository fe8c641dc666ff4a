"""opscope's version, in a module that imports nothing, so any layer may read it without
pulling in the package's convenience imports (``opscope/__init__`` reaches analysis and report)."""
__version__ = "0.1.0"
