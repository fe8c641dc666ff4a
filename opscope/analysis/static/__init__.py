"""The static scan: every CUDA-specific API in a project's source, found without running it, and the safe rewrites."""
