"""tinygpt: a WebGPU trainer for small GPT models (wgpu-py, WGSL kernels, NumPy reference).

The Python API (docs/api.md): GPT.load / GPT.from_preset, then logits, loss, generate, train and
save; the tokenizers; the errors every command raises, each one line for the user.
"""
from .core.version import __version__

from .api import GPT, Trainer
from .files.checkpoint import CheckpointError
from .core.config import PRESETS, Config
from .core.errors import OutputError, TinyGPTError, UsageError
from .files.data import DataError
from .tokenizers import ByteTokenizer, GPT2Tokenizer, get_tokenizer
from .run.safety import Interrupted, TrainingStopped

__all__ = ["GPT", "Trainer", "Config", "PRESETS", "get_tokenizer", "ByteTokenizer", "GPT2Tokenizer",
           "TinyGPTError", "UsageError", "OutputError", "CheckpointError", "DataError", "TrainingStopped",
           "Interrupted", "__version__"]
