"""tpload: a tensor-parallel, verified checkpoint loader for mixture-of-experts models."""

from .api import LoadOptions, RankShards, load
from .errors import CheckpointError, ConfigError, LayoutError, LoadError

__all__ = ["load", "LoadOptions", "RankShards", "LoadError", "CheckpointError", "ConfigError", "LayoutError"]
__version__ = "0.1.0"
