"""Test environment only (on PYTHONPATH of the framework scans): this index's torchvision 0.28 is a
CUDA build whose extension does not load next to the CPU torch; transformers and timm import
torchvision, so define its NMS operators first (``opscope.fleet.tv_compat``) when that is the case."""
try:
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        from opscope.fleet.tv_compat import import_torchvision

        import_torchvision()
except Exception:  # the scan then reports torchvision's own import error
    pass
