"""``--lr-scheduler warmup_hold_inverse_sqrt``: linear warmup, a constant hold, then inverse-sqrt decay.

E-ATT (*Attention Mechanism with Energy-Friendly Operations*, Appendix B) trains with::

    lr(t) = 0.001 * min(t / 8000, 1, (20000 / t) ** 0.5)

i.e. ``lr(t) = lr * min(t / W, 1, sqrt(D / t))`` with W = ``--warmup-updates`` (8000) and
D = ``--decay-start-updates`` (20000).  fairseq's stock ``inverse_sqrt`` with warmup W is
``lr * min(t / W, sqrt(W / t))``: its decay starts at the end of the warmup, so it equals this
schedule only when D = W (the E-ATT schedule holds the peak from update 8,000 to 20,000 and is
sqrt(D / W) = 1.58 times higher than ``inverse_sqrt`` at every later update).  ``tri_stage``
(warmup, hold, *exponential* decay) does not match either.

Step convention: ``t`` is the 1-based number of the update being made.  fairseq calls
``step_update(n)`` once the optimizer is built (n = 0), after each update n and after loading a
checkpoint at update n, and the rate it sets is used by update n + 1, so ``step_update(n)`` sets
``lr(n + 1)``: the first update uses lr / W (not 0), update t uses exactly ``lr(t)``, and a
resumed run continues the same sequence.  The rate is a function of the update number only
(nothing to save in the checkpoint).
"""

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import List

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II


@dataclass
class WarmupHoldInverseSqrtConfig(FairseqDataclass):
    warmup_updates: int = field(
        default=8000, metadata={"help": "W: the rate rises linearly to --lr over the first W updates (lr * t / W)"}
    )
    decay_start_updates: int = field(
        default=20000,
        metadata={"help": "D: the rate stays at --lr until update D, then decays as lr * sqrt(D / t); D >= W"},
    )
    lr: List[float] = II("optimization.lr")


def warmup_hold_inverse_sqrt(t, lr, warmup_updates, decay_start_updates):
    """The rate of update ``t`` (1-based): ``lr * min(t / W, 1, sqrt(D / t))`` (E-ATT App. B).

    Raises:
        ValueError: ``t`` < 1, W < 1 or D < W.
    """
    if t < 1:
        raise ValueError(f"update number t must be >= 1 (1-based), got {t}")
    if warmup_updates < 1 or decay_start_updates < warmup_updates:
        raise ValueError(f"need 1 <= --warmup-updates <= --decay-start-updates, got {warmup_updates} and "
                         f"{decay_start_updates}")
    return lr * min(t / warmup_updates, 1.0, (decay_start_updates / t) ** 0.5)


@register_lr_scheduler("warmup_hold_inverse_sqrt", dataclass=WarmupHoldInverseSqrtConfig)
class WarmupHoldInverseSqrtSchedule(FairseqLRScheduler):
    """``lr * min(t / W, 1, sqrt(D / t))`` for update t (see the module docstring; E-ATT App. B:
    lr 0.001, W 8000, D 20000).

    Raises:
        ValueError: several ``--lr`` values (this schedule has one peak rate), W < 1 or D < W.
    """

    def __init__(self, cfg: WarmupHoldInverseSqrtConfig, optimizer):
        super().__init__(cfg, optimizer)
        if isinstance(cfg.lr, Collection) and len(cfg.lr) > 1:
            raise ValueError("warmup_hold_inverse_sqrt takes one --lr (the peak rate); got "
                             f"{list(cfg.lr)}. Use --lr-scheduler fixed for a per-epoch list.")
        self.peak = float(cfg.lr[0] if isinstance(cfg.lr, Collection) else cfg.lr)
        self.warmup_updates = int(cfg.warmup_updates)
        self.decay_start_updates = int(cfg.decay_start_updates)
        self.lr = warmup_hold_inverse_sqrt(1, self.peak, self.warmup_updates, self.decay_start_updates)
        self.optimizer.set_lr(self.lr)

    def step(self, epoch, val_loss=None):
        """End of an epoch: the rate depends on the update number only; unchanged."""
        super().step(epoch, val_loss)
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        """After ``num_updates`` updates: set the rate of update ``num_updates + 1``."""
        self.lr = warmup_hold_inverse_sqrt(num_updates + 1, self.peak, self.warmup_updates, self.decay_start_updates)
        self.optimizer.set_lr(self.lr)
        return self.lr
