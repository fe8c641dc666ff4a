"""What will be slow on the NPU and whether it fits: kernels, their cost, the per-step estimate, the memory fit, and the estimate against a real NPU profile."""
