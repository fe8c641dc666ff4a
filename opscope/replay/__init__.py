"""opscope.replay: run captured operators again on a device (verification)."""
