"""EvoTrainer: co-evolving LLM policies and their training harnesses.

The core (this package minus `evotrainer.train`) imports no torch/transformers/trl/peft/anthropic/
IPython: training runs in a subprocess (`python -m evotrainer.train VERSION_DIR`).
"""
from .store import Store

__all__ = ["Store", "__version__"]
__version__ = "0.1.0"
