"""Learning-rate schedules the papers use that fairseq does not ship (registered on import)."""

from . import warmup_hold_inverse_sqrt  # noqa: F401
