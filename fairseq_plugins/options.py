"""Options as fairseq dataclasses: each option declared once (flag, default, help, valid range)
and checked once.

fairseq turns dataclass fields into command-line flags (``gen_parser_from_dataclass``: field
``reg_weight`` -> ``--reg-weight``; a nested :class:`~fairseq.dataclass.FairseqDataclass` field
``reluformer`` with a field ``gamma`` -> ``--reluformer-gamma``) and ``fairseq-hydra-train`` reads
the same names from YAML.  This module adds what fairseq leaves out:

* :func:`option` -- a field carrying its help *and its valid range* (``gt``/``ge``/``lt``/``le``;
  floats must be finite unless ``allow_inf``);
* :func:`check_fields` -- the one check of a dataclass instance (finite floats, ranges, choices
  of ``ChoiceEnum`` fields, integers), raising ``ValueError`` that names the flag and the valid
  range or choices;
* :class:`OptionGroup` -- a small dataclass of options sharing a flag prefix (e.g. the
  hyper-parameters of one family of attention functions, ``--reluformer-*``), read from any
  flat ``args``-like object (``argparse.Namespace``, omegaconf ``DictConfig``, a model config)
  with :meth:`OptionGroup.from_args`, which validates.

A ``nan`` or ``inf`` given for an option would otherwise pass fairseq's start-up and fail (or
silently train something else) after the first update.
"""

import math
from dataclasses import field, fields, is_dataclass
from enum import Enum
from typing import Any, Callable, Dict, Iterable, Optional, Sequence

from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.utils import interpret_dc_type
from fairseq.utils import safe_getattr

__all__ = ["option", "flag_name", "check_number", "check_choice", "check_fields", "OptionGroup",
           "field_choices"]


def option(default: Any, help: str, *, gt=None, ge=None, lt=None, le=None, allow_inf: bool = False):
    """A dataclass field with ``help`` and its valid range.

    Args:
        default: the default value.
        help: the ``--help`` text (shown by ``fairseq-train --help``).
        gt, ge, lt, le: bounds (``value > gt``, ``>= ge``, ``< lt``, ``<= le``); None = unbounded.
        allow_inf: a float option that may be ``inf`` (never ``nan``).
    """
    bounds = {k: v for k, v in (("gt", gt), ("ge", ge), ("lt", lt), ("le", le)) if v is not None}
    return field(default=default, metadata={"help": help, "bounds": bounds, "allow_inf": allow_inf})


def flag_name(attr: str) -> str:
    """``"reg_weight"`` -> ``"--reg-weight"``."""
    return "--" + attr.replace("_", "-")


_OPS = {"gt": (">", lambda v, b: v > b), "ge": (">=", lambda v, b: v >= b),
        "lt": ("<", lambda v, b: v < b), "le": ("<=", lambda v, b: v <= b)}


def _range_text(bounds: Dict[str, Any]) -> str:
    return " and ".join(f"{_OPS[k][0]} {b:g}" for k, b in bounds.items())


def check_number(flag: str, value: Any, *, integer: bool = False, allow_inf: bool = False, **bounds):
    """Check one number and return it as ``float`` (``int`` with ``integer=True``).

    Strings are converted (``"inf"`` from ``--model-overrides``); ``nan`` is always refused,
    ``inf`` unless ``allow_inf``.

    Args:
        flag: the option's flag, named in the error (e.g. ``"--eatt-tau"``).
        bounds: ``gt``/``ge``/``lt``/``le`` as in :func:`option`.

    Raises:
        ValueError: not a number, not finite, not an integer, or out of range -- e.g.
            ``--reluformer-gamma must be a finite number > 0, got nan``.
    """
    what = "an integer" if integer else ("a number (inf allowed)" if allow_inf else "a finite number")
    need = f"{flag} must be {what}" + (f" {_range_text(bounds)}" if bounds else "")
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{need}, got {value!r}") from None
    if math.isnan(number) or (math.isinf(number) and not (allow_inf and not integer)):
        raise ValueError(f"{need}, got {value!r}")
    if integer:
        if number != int(number):
            raise ValueError(f"{need}, got {value!r}")
        number = int(number)
    for k, b in bounds.items():
        if not _OPS[k][1](number, b):
            raise ValueError(f"{need}, got {value!r}")
    return number


def check_choice(flag: str, value: Any, choices: Sequence[str]) -> str:
    """Return ``value`` as ``str`` if it is one of ``choices``.

    Raises:
        ValueError: ``--flag 'x' is not a valid choice; valid choices: a, b, c``.
    """
    v = value.value if isinstance(value, Enum) else value
    if v not in choices:
        raise ValueError(f"{flag} {v!r} is not a valid choice; valid choices: {', '.join(choices)}")
    return v


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (a count such as ``--limit`` or ``--max-sentences``,
    where 0 or a negative number would analyse nothing, or all but the last -N items).

    Raises:
        argparse.ArgumentTypeError: ``must be a positive integer, got '0'`` (argparse prints it
        as a usage error naming the flag, before any work starts).
    """
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def field_choices(f) -> Optional[Sequence[str]]:
    """The choices of a ``ChoiceEnum`` (optionally ``Optional[...]``) dataclass field, else None."""
    t = interpret_dc_type(f.type)
    if isinstance(t, type) and issubclass(t, Enum):
        return [e.value for e in t]
    return None


def _is_group(t) -> bool:
    return isinstance(t, type) and issubclass(t, FairseqDataclass)


def check_fields(obj, flag_of: Callable[[str], str] = flag_name, prefix: str = "") -> None:
    """Check every field of the dataclass instance ``obj`` against its declaration.

    * ``float`` fields: a finite number (``inf`` if declared ``allow_inf``), within the bounds
      declared with :func:`option`; ``int`` fields: an integer within them;
    * ``ChoiceEnum`` fields: one of the choices;
    * nested dataclass fields (fairseq's ``encoder``/``decoder`` sub-configs, option groups):
      checked recursively, their flags prefixed like fairseq's (``--encoder-layerdrop``).

    ``None`` (an unset optional value) and interpolation strings (``"${...}"``) pass.

    Raises:
        ValueError: naming the flag (``flag_of(prefix + name)``) and the valid range or choices.
    """
    for f in fields(obj):
        if f.name.startswith("_"):
            continue
        value = getattr(obj, f.name)
        name = prefix + f.name
        t = interpret_dc_type(f.type)
        if isinstance(value, OptionGroup):
            value.validate()  # its own flags and any check across its fields
            continue
        if _is_group(t):
            if is_dataclass(value) and not isinstance(value, type):
                check_fields(value, flag_of, name + "_")
            continue
        if value is None or (isinstance(value, str) and value.startswith("${")):
            continue
        choices = field_choices(f)
        if choices is not None:
            check_choice(flag_of(name), value, choices)
        elif t is float or t is int:
            meta = f.metadata or {}
            check_number(flag_of(name), value, integer=t is int, allow_inf=meta.get("allow_inf", False),
                         **meta.get("bounds", {}))


class OptionGroup(FairseqDataclass):
    """Base of a dataclass of options sharing the flag prefix :attr:`prefix`.

    Field ``gamma`` of a group with prefix ``"reluformer"`` is the flat attribute
    ``reluformer_gamma`` of fairseq's ``args`` and the flag ``--reluformer-gamma``; a model
    config composes a group as a field named like the prefix (``reluformer: ReluFormerOptions``),
    from which fairseq generates exactly these flags.  Subclasses are ``@dataclass``es that
    declare their fields with :func:`option` and may extend :meth:`validate` with checks that
    involve several fields.
    """

    # (plain class attributes, not ``ClassVar`` annotations: fairseq would make those flags too)
    #: flag prefix, e.g. ``"reluformer"`` (flags ``--reluformer-*``, attributes ``reluformer_*``)
    prefix = ""
    #: what the options belong to, for messages (e.g. ``"ReLUFormer"``)
    family = ""

    @classmethod
    def option_names(cls) -> Iterable[str]:
        """Field names (without the prefix), e.g. ``gamma``."""
        return [f.name for f in fields(cls) if not f.name.startswith("_")]

    @classmethod
    def attr(cls, name: str) -> str:
        """Flat attribute of field ``name``: ``reluformer_gamma``."""
        return f"{cls.prefix}_{name}"

    @classmethod
    def flag(cls, name: str) -> str:
        """Flag of field ``name``: ``--reluformer-gamma``."""
        return flag_name(cls.attr(name))

    @classmethod
    def from_args(cls, args) -> "OptionGroup":
        """The group's values from a flat ``args``-like object, validated.

        Args:
            args: ``argparse.Namespace``, ``DictConfig``, a model config, any object with
                attributes, or None.  A missing or ``None`` attribute gives the field's default.
                A model config holding the group itself (attribute :attr:`prefix`) is used as is.

        Raises:
            ValueError: see :meth:`validate`.
        """
        own = safe_getattr(args, cls.prefix, None) if args is not None and cls.prefix else None
        if isinstance(own, cls):
            group = own
        else:
            values = {}
            for name in cls.option_names():
                v = safe_getattr(args, cls.attr(name), None) if args is not None else None
                if v is not None:
                    values[name] = v
            group = cls(**values)
        group.validate()
        return group

    def validate(self) -> None:
        """Check every field (:func:`check_fields`); the error names the flag.

        Raises:
            ValueError: a non-finite or out-of-range number, or an invalid choice.
        """
        check_fields(self, lambda name: flag_name(self.attr(name)))

    def given(self) -> Dict[str, Any]:
        """Fields whose value differs from the default: ``{flag: value}``."""
        defaults = type(self)()
        return {self.flag(n): getattr(self, n) for n in self.option_names()
                if getattr(self, n) != getattr(defaults, n)}
