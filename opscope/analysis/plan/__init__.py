"""The release plan: which torch_npu release to port to, what it pairs with, and what in the environment must change."""
