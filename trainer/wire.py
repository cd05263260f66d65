"""The names a step report carries: its phases and its memory keys. Plain data, no torch, so the tailers that
read a framework's logs (`trimtab verl-tail`) share them with the hook without importing torch."""

PHASES = ("generation", "evaluation", "communication", "update", "validation", "checkpoint", "wait", "other")
NAMED_PHASES = PHASES[:-1]  # "other" is whatever the step's wall time leaves
WIRE_KEYS = ("allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "total_bytes", "fragmentation",
             "num_alloc_retries", "num_ooms")
