"""The control loop: plans per job, verdicts, the bracket search, the memory model, placement."""
