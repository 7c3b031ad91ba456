"""Models and architecture presets registered with fairseq."""

from . import rnnsearch, transformer  # noqa: F401
