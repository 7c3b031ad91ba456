"""Models and architecture presets registered with fairseq."""

from . import transformer  # noqa: F401
