"""Reads: metric sources (NVML, host, simulated node), the sampler loop, the spool and the shipping sinks."""
