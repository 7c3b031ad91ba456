"""fairseq plugin for attention variants in machine translation.

Use with ``fairseq-train --user-dir fairseq_plugins`` (and the same flag for
``fairseq-generate`` / ``fairseq-interactive``).  Importing the package registers, and does
nothing else:

* the attention functions (:mod:`fairseq_plugins.attention`),
* the models and architecture presets (:mod:`fairseq_plugins.models`),
* the criterions (:mod:`fairseq_plugins.criterions`),
* the learning-rate schedulers (:mod:`fairseq_plugins.optim`: ``warmup_hold_inverse_sqrt``, E-ATT's),
* the allow-list of types fairseq stores in checkpoints, so that ``torch.load`` with
  ``weights_only=True`` (the default from torch 2.6) loads them (:mod:`fairseq_plugins.checkpoint`).
"""

from . import checkpoint  # noqa: F401  (registers safe globals for torch.load)
from . import analysis, attention, criterions, modules, models, optim  # noqa: F401

__version__ = "0.1.0"
