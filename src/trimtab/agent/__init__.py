"""Reads: metric sources (NVML, host, simulated node), the sampler loop, the writer and its spool, and the sink that
ships batches to a server (the sink protocol itself is the contract's: ``trimtab.contract.sink``)."""

from trimtab.agent.runner import Agent, make_sources
from trimtab.agent.sampler import Sampler
from trimtab.agent.simulated import SimulatedNode
from trimtab.agent.sinks import HttpSink
from trimtab.agent.source import Inventory, Source, SourceUnavailable
from trimtab.agent.spool import Spool
from trimtab.agent.writer import Writer, WriterStatus

__all__ = ["Agent", "HttpSink", "Inventory", "Sampler", "SimulatedNode", "Source", "SourceUnavailable", "Spool",
           "Writer", "WriterStatus", "make_sources"]
