"""Support verdicts: one torch_npu verdict with its evidence per operator (ATen, third-party, per chip and dtype), and the advice that follows."""
