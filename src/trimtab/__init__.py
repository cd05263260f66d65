"""trimtab: keeps multi-GPU RL post-training jobs balanced.

The top-level package holds only what every part shares (version, paths, configuration); each part
lives in its own top-level folder mapped to ``trimtab.<part>`` by pyproject.toml.
"""

__version__ = "0.1.0"
