"""Training budgets (``configs/**/*.yaml``) and the commands one budget defines for one run.

A budget is a YAML mapping::

    base: configs/multi30k/small_cpu.yaml   # optional: loaded first, then overridden key by key
    regime: smoke | diagnostic | converged | paper   # what its numbers can claim
    tag: converged_6k                                # optional, for a budget tables run under (mt-table --budget,
                                                     # a plan's budget:): names their run directories (runs/<tag>/...)
                                                     # and pages (<out>_<tag>.md) instead of the regime; "<regime>_...";
                                                     # not inherited by a budget that names this one as its base
    train: {fairseq-train flag: value, ...}          # without "--"; true = bare flag, null/false = off
    train-gpu: {fp16: true}                          # added to `train` when CUDA is available
    average: {num-update-checkpoints: N} | {num-epoch-checkpoints: N} | {checkpoint: best}
    generate: {beam: 4, lenpen: 0.6, batch-size: 128, extra: {...}}
    data: {corpus: multi30k, bpe-merges: 8000, subsets: [test, test1], variant: ..., out: ...}
    batch: {tokens_per_update: ..., max_tokens_per_gpu: ...}   # paper-scale budgets (reproduce --gpus)

The command builders return argument lists (no shell): data preparation
(``data-prep/<corpus>/prepare.sh``), ``fairseq-train``, checkpoint averaging
(:mod:`mt_pipeline.averaging`) and evaluation (:mod:`mt_pipeline.evaluate`).  Python steps run as
``python -m mt_pipeline.<module>`` from the repository root, so they use this checkout's code.
"""

import difflib
import math
import os
import re
import shlex
import sys
from typing import Dict, List, Optional, Tuple

import yaml

from .provenance import REGIMES, ROOT  # REGIMES: what a budget's numbers can claim

__all__ = ["REGIMES", "SCHEMA", "flags", "merge", "load_budget", "check_budget", "nearest", "regime", "run_tag", "train_flags", "prep_dir", "prep_cmd",
           "build_train_cmd", "train_env", "averaging_problem", "average_cmd", "decode_checkpoint", "eval_cmd"]

BIN = os.path.dirname(sys.executable)


def flags(mapping: Dict) -> List[str]:
    """YAML mapping -> fairseq CLI flags (``true`` = bare flag, ``false``/None = omitted)."""
    out = []
    for k, v in mapping.items():
        if v is True:
            out.append(f"--{k}")
        elif v is False or v is None:
            continue
        else:
            out += [f"--{k}", str(v)]
    return out


def merge(base: Dict, over: Dict) -> Dict:
    """Deep-merge two YAML mappings (``over`` wins; nested mappings are merged key by key)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


#: the keys of a budget and of each of its sections (``train``/``train-gpu``/``bleu`` hold free keys)
SCHEMA = {
    None: ("base", "regime", "tag", "train", "train-gpu", "average", "generate", "data", "batch", "bleu"),
    "average": ("num-update-checkpoints", "num-epoch-checkpoints", "checkpoint"),
    "generate": ("beam", "lenpen", "batch-size", "extra"),
    "data": ("corpus", "out", "bpe-merges", "subsets", "variant", "prep-flags", "train-lines"),
    "batch": ("tokens_per_update", "max_tokens_per_gpu", "sentences_per_update", "max_sentences_per_gpu", "fp16"),
}


def nearest(word: str, valid) -> str:
    """`` (did you mean 'X'?)`` for the valid name closest to ``word``, or an empty string."""
    close = difflib.get_close_matches(str(word), list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def check_budget(budget, where: str = "budget") -> None:
    """Check a merged budget against :data:`SCHEMA` before any work: every key known (an unknown
    one names the nearest valid key), ``regime`` one of :data:`REGIMES`, ``train`` a mapping,
    ``average`` exactly one valid choice, ``generate`` a positive ``beam``/``batch-size`` and a
    finite ``lenpen``, ``data`` a corpus of ``data-prep/`` and a non-empty list of ``subsets``.

    Raises:
        SystemExit: every problem found, one per line, each naming the valid choices.
    """
    if not isinstance(budget, dict):
        raise SystemExit(f"{where}: a budget is a YAML mapping (train:, generate:, data:, ...), got "
                         f"{type(budget).__name__}")
    problems = []
    for key in budget:
        if key not in SCHEMA[None]:
            problems.append(f"unknown key {key!r}{nearest(key, SCHEMA[None])}; valid: {', '.join(SCHEMA[None])}")
    for section, keys in SCHEMA.items():
        if section is None or section not in budget:
            continue
        value = budget[section]
        if not isinstance(value, dict):
            problems.append(f"`{section}` must be a mapping of {', '.join(keys)}; got {value!r}")
            continue
        for key in value:
            if key not in keys:
                problems.append(f"unknown key {section}.{key}{nearest(key, keys)}; valid: {', '.join(keys)}")
    for section in ("train", "train-gpu", "bleu"):
        if section in budget and not isinstance(budget[section], dict):
            problems.append(f"`{section}` must be a mapping; got {budget[section]!r}")
    if "train" not in budget:
        problems.append("no `train:` section (the fairseq-train flags)")
    r = budget.get("regime", "unstated")
    if r != "unstated" and r not in REGIMES:
        problems.append(f"regime {r!r}{nearest(r, REGIMES)}; valid: {', '.join(REGIMES)}")
    tag = budget.get("tag")
    if tag is not None and not (isinstance(tag, str) and re.fullmatch(rf"{re.escape(r)}_[a-z0-9_]+", tag)):
        problems.append(f"tag {tag!r}: a budget's tag is its regime, an underscore and lower-case letters, digits "
                        f"or underscores (e.g. {r}_6k), so its run directories sort beside the regime's")
    avg = budget.get("average")
    if isinstance(avg, dict):
        given = [k for k in SCHEMA["average"] if avg.get(k) is not None]  # null: a base's choice switched off
        if len(given) != 1:
            problems.append(f"`average` {avg!r}: give exactly one of `num-update-checkpoints: N`, "
                            "`num-epoch-checkpoints: N`, `checkpoint: best`")
        elif given[0] == "checkpoint" and avg["checkpoint"] != "best":
            problems.append(f"average.checkpoint {avg['checkpoint']!r}: the only choice is `best`")
        elif given[0] != "checkpoint" and not _positive_int(avg[given[0]]):
            problems.append(f"average.{given[0]} must be a positive integer; got {avg[given[0]]!r}")
    gen = budget.get("generate")
    if isinstance(gen, dict):
        for key in ("beam", "batch-size"):
            if key in gen and not _positive_int(gen[key]):
                problems.append(f"generate.{key} must be a positive integer; got {gen[key]!r}")
        lp = gen.get("lenpen", 1.0)
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
            problems.append(f"generate.lenpen must be a finite number; got {lp!r}")
        if "extra" in gen and not isinstance(gen["extra"], dict):
            problems.append(f"generate.extra must be a mapping of fairseq-generate flags; got {gen['extra']!r}")
    data = budget.get("data")
    if isinstance(data, dict):
        corpora = sorted(d for d in os.listdir(os.path.join(ROOT, "data-prep"))
                         if os.path.isfile(os.path.join(ROOT, "data-prep", d, "prepare.sh")))
        if "corpus" in data and data["corpus"] not in corpora:
            problems.append(f"data.corpus {data['corpus']!r}{nearest(data['corpus'], corpora)}; valid: {', '.join(corpora)}")
        subsets = data.get("subsets")
        if "subsets" in data and not (isinstance(subsets, list) and subsets
                                      and all(isinstance(x, str) and x for x in subsets)):
            problems.append(f"data.subsets must be a non-empty list of subset names (e.g. [test, test1]); got {subsets!r}")
    if problems:
        raise SystemExit(f"{where}: " + ("\n  ".join([""] + problems) if len(problems) > 1 else problems[0]))


def load_budget(path: str) -> Dict:
    """Read a budget YAML, its ``base:`` chain (paths relative to the repo root) merged first, and
    check the result (:func:`check_budget`) before any work is done with it.

    Raises:
        SystemExit: the file (or a base) does not exist or is not valid YAML, bases form a cycle,
            or the merged budget does not pass :func:`check_budget`.
    """
    seen: List[str] = []
    chain = []
    while path:
        path = path if os.path.isabs(path) else os.path.join(ROOT, path)
        if path in seen:
            raise SystemExit(f"budget bases form a cycle: {seen + [path]}")
        if not os.path.exists(path):
            raise SystemExit(f"budget config not found: {path}")
        seen.append(path)
        try:
            with open(path) as f:
                cfg = yaml.safe_load(f)
        except yaml.YAMLError as err:
            raise SystemExit(f"budget {path} is not valid YAML: {err}") from None
        if cfg is None:
            raise SystemExit(f"budget {path} is empty; a budget is a mapping (train:, generate:, data:, ...)")
        if not isinstance(cfg, dict):
            raise SystemExit(f"budget {path} is a YAML {type(cfg).__name__}, not a mapping (train:, generate:, "
                             "data:, ...)")
        chain.append(cfg)
        path = cfg.get("base")
    budget: Dict = {}
    for cfg in reversed(chain):  # a base's tag is not inherited: it names the base's own runs
        budget = merge(budget, {k: v for k, v in cfg.items() if k != "base" and (k != "tag" or cfg is chain[0])})
    check_budget(budget, f"budget {seen[0]}")
    return budget


def regime(budget: Dict) -> str:
    """The budget's ``regime`` (one of :data:`REGIMES`; ``unstated`` when missing).

    Raises:
        SystemExit: an unknown regime (the message names the valid ones).
    """
    r = budget.get("regime", "unstated")
    if r != "unstated" and r not in REGIMES:
        raise SystemExit(f"budget regime {r!r}; valid: {', '.join(REGIMES)}")
    return r


def run_tag(budget: Dict) -> str:
    """The name a budget gives its run directories and pages: its ``tag`` (a variant of its regime,
    e.g. ``converged_6k`` for the converged budget trained twice as long), else its regime."""
    return budget.get("tag") or regime(budget)


def train_flags(budget: Dict, cuda: bool, max_update: Optional[int] = None) -> Dict:
    """The effective ``train`` mapping: the budget's, plus ``train-gpu`` when ``cuda``, with
    ``max-update`` overridden when given."""
    cfg = dict(budget["train"])
    if cuda:
        cfg.update(budget.get("train-gpu") or {})
    if max_update:
        cfg["max-update"] = max_update
    return cfg


def _data_out(budget: Dict) -> str:
    data = budget["data"]
    return os.path.join(ROOT, data.get("out", os.path.join("data-bin", f"{data['corpus']}_en_de")))


def prep_dir(budget: Dict) -> str:
    """The prep dir the budget's data preparation fills (``raw/``, ``tok/``, ``bin/``, ...)."""
    data = budget["data"]
    out = _data_out(budget)
    return os.path.join(out, data["variant"]) if data.get("variant") else out


def prep_cmd(budget: Dict, references_only: bool = False) -> List[str]:
    """The data-prep command (idempotent) for ``budget``; with ``references_only``, stopped after
    the stage that writes the references its runs are scored against (``--until``: what
    re-scoring committed hypotheses needs, e.g. Multi30k's ``raw/``, without BPE or binarising).

    Raises:
        SystemExit: (``references_only``) the budget's corpus is not one of data-prep/."""
    data = budget["data"]
    cmd = ["bash", os.path.join(ROOT, "data-prep", data["corpus"], "prepare.sh"), "--out", _data_out(budget)]
    if references_only:
        from .prep.cli import reference_stage

        cmd += ["--until", reference_stage(data["corpus"])]
    if data.get("bpe-merges"):
        cmd += ["--bpe-merges", str(data["bpe-merges"])]
    if data.get("train-lines"):
        cmd += ["--train-lines", str(data["train-lines"])]
    if data.get("variant") and os.path.exists(os.path.join(ROOT, "data-prep", data["corpus"], "corpus.yaml")):
        # a corpus.yaml variant (mt-prep --variant) is the prep_dir above, <out>/<variant>/: a recipe
        # variant (e.g. wmt14_en_de's `eatt`, truecased) writes it; the long-document preps build
        # every length in one run and check that L<L> is one of them
        cmd += ["--variant", data["variant"]]
    return cmd + flags(data.get("prep-flags") or {})


def build_train_cmd(data_bin: str, ckpt_dir: str, arch: str, src: str, tgt: str, train_cfg: Dict,
                    fns: Optional[List[str]] = None, extra: str = "", cpu: bool = False,
                    user_dir: Optional[str] = None) -> List[str]:
    """The fairseq-train command of one run: the budget's ``train`` flags, the attention
    functions ``fns`` (encoder self, decoder self, cross) when given, ``extra`` flags (a
    shell-quoted string) and ``--cpu`` when ``cpu``; ``--user-dir`` the plugin's, or ``user_dir``
    (a researcher's own that imports the plugin, docs/extending.md).  On a GPU, a budget that does not set
    ``distributed-world-size`` (every budget but the paper-scale ones ``reproduce`` resolves for
    N GPUs) trains on one device: ``--distributed-world-size 1`` -- fairseq's default is every
    visible GPU, which would multiply the budget's tokens per update by their number."""
    cmd = [os.path.join(BIN, "fairseq-train"), data_bin,
           "--user-dir", os.path.abspath(user_dir) if user_dir else os.path.join(ROOT, "fairseq_plugins"),
           "--arch", arch, "--source-lang", src, "--target-lang", tgt, "--save-dir", ckpt_dir, *flags(train_cfg)]
    if fns:
        cmd += ["--encoder-attention-fn", fns[0], "--decoder-attention-fn", fns[1], "--cross-attention-fn", fns[2]]
    if cpu:
        cmd.append("--cpu")
    elif "distributed-world-size" not in train_cfg and "--distributed-world-size" not in shlex.split(extra or ""):
        cmd += ["--distributed-world-size", "1"]
    return cmd + shlex.split(extra or "")


#: the variables from which fairseq infers a SLURM job's world size (``_infer_slurm_init``)
SLURM_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")


def train_env(train_cfg: Dict, env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of one ``fairseq-train`` of the pipeline (``env``, default ``os.environ``).
    A multi-GPU run (``distributed-world-size`` > 1) is one process on one node that spawns a rank
    per GPU; inside a SLURM allocation fairseq would instead infer the world size from SLURM (with
    one task per node: every GPU of the nodes, whatever ``--distributed-world-size`` says), so
    the node-list variables are left out and fairseq's single-node start applies (its own check
    that the node has that many GPUs included).  Multi-node training: ``mt-train-distributed``."""
    env = dict(os.environ if env is None else env)
    if int(train_cfg.get("distributed-world-size") or 1) > 1:
        for key in SLURM_NODELIST_VARS:
            env.pop(key, None)
    return env


def averaging_problem(budget: Dict, train_cfg: Dict) -> Optional[str]:
    """Why the budget's ``average`` cannot find its checkpoints after training with ``train_cfg``
    (the :func:`train_flags`), or ``None``: checked before training, since the averaging runs after it.

    - ``num-update-checkpoints: N``: fairseq writes ``checkpoint_E_U.pt`` at every multiple of
      ``save-interval-updates`` (none without it), so ``max-update // save-interval-updates`` must be
      >= N, and ``keep-interval-updates`` (when set) >= N;
    - ``num-epoch-checkpoints: N``: not with ``no-epoch-checkpoints``, and ``keep-last-epochs`` (when
      set) >= N (the number of epochs depends on the data and is not checked).

    E.g. the smoke budget (every 50 updates, 3 averaged) with ``--max-update 100`` would train, then
    fail to average (2 checkpoints).
    """
    avg = budget.get("average") or {}

    def flag(key):
        v = train_cfg.get(key)
        return None if v is None or isinstance(v, bool) else int(v)

    n = avg.get("num-update-checkpoints")
    if n:
        n, every, last, keep = int(n), flag("save-interval-updates"), flag("max-update"), flag("keep-interval-updates")
        if not every:
            return (f"average.num-update-checkpoints {n} needs update checkpoints: set train.save-interval-updates "
                    f"(fairseq writes checkpoint_E_U.pt every that many updates)")
        if last and last // every < n:
            return (f"max-update {last} with save-interval-updates {every} writes {last // every} update "
                    f"checkpoint(s), fewer than average.num-update-checkpoints {n}: use max-update >= {n * every}")
        if keep is not None and 0 < keep < n:
            return f"keep-interval-updates {keep} keeps fewer than average.num-update-checkpoints {n}"
    n = avg.get("num-epoch-checkpoints")
    if n:
        n, keep = int(n), flag("keep-last-epochs")
        if train_cfg.get("no-epoch-checkpoints"):
            return f"average.num-epoch-checkpoints {n} needs epoch checkpoints, but train.no-epoch-checkpoints is set"
        if keep is not None and 0 < keep < n:
            return f"keep-last-epochs {keep} keeps fewer than average.num-epoch-checkpoints {n}"
    return None


def average_cmd(ckpt_dir: str, n_avg: int, output: str, kind: str = "update") -> List[str]:
    """Average the last ``n_avg`` update (``kind="update"``) or epoch checkpoints of ``ckpt_dir``."""
    return [sys.executable, "-m", "mt_pipeline.averaging", "--inputs", ckpt_dir,
            f"--num-{kind}-checkpoints", str(n_avg), "--output", output]


def decode_checkpoint(budget: Dict, run_dir: str) -> Tuple[str, Optional[List[str]]]:
    """``(checkpoint, command)``: the checkpoint a run is evaluated with and the command that
    makes it (``None`` when fairseq writes it itself), from the budget's ``average`` section:

    - ``num-update-checkpoints: N`` -> ``<run_dir>/average_lastN.pt`` (last N update checkpoints);
    - ``num-epoch-checkpoints: N`` -> ``<run_dir>/average_lastN_epochs.pt`` (last N epoch checkpoints);
    - ``checkpoint: best`` -> ``<run_dir>/checkpoints/checkpoint_best.pt``, fairseq's best on the
      validation set, no averaging (E-ATT App. B: "we choose the best model over dev set").

    Raises:
        SystemExit: an ``average`` section with none of these keys (the message names them).
    """
    avg = budget.get("average") or {}
    if avg.get("checkpoint") == "best":
        return os.path.join(run_dir, "checkpoints", "checkpoint_best.pt"), None
    for key, kind, suffix in (("num-update-checkpoints", "update", ""), ("num-epoch-checkpoints", "epoch", "_epochs")):
        if avg.get(key):
            n = int(avg[key])
            out = os.path.join(run_dir, f"average_last{n}{suffix}.pt")
            return out, average_cmd(os.path.join(run_dir, "checkpoints"), n, out, kind=kind)
    raise SystemExit(f"budget `average` section {avg!r}: give `num-update-checkpoints: N` (average the last N "
                     "update checkpoints), `num-epoch-checkpoints: N` (the last N epoch checkpoints) or "
                     "`checkpoint: best` (fairseq's checkpoint_best.pt)")


def eval_cmd(gen: Dict, checkpoint: str, data_bin: str, prep: str, src: str, tgt: str, subsets: List[str],
             eval_dir: str, ribes: bool = False, user_dir: Optional[str] = None) -> List[str]:
    """The evaluation command (:mod:`mt_pipeline.evaluate`: generate + sacreBLEU + chrF +
    tokenized BLEU, + RIBES when ``ribes``) for the budget's ``generate`` section ``gen``;
    ``user_dir``: the ``--user-dir`` the model was trained with (default: the plugin's)."""
    return ([sys.executable, "-m", "mt_pipeline.evaluate", "--checkpoint", checkpoint, "--data-bin", data_bin,
             "--prep-dir", prep, "--src", src, "--tgt", tgt, "--subsets", ",".join(subsets),
             "--beam", str(gen["beam"]), "--lenpen", str(gen["lenpen"]), "--batch-size", str(gen["batch-size"]),
             "--out", eval_dir] + (["--extra", " ".join(flags(gen["extra"]))] if gen.get("extra") else [])
            + (["--ribes"] if ribes else []) + (["--user-dir", os.path.abspath(user_dir)] if user_dir else []))
