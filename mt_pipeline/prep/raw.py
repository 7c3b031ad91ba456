"""Stage raw: the detokenized text of every split, one sentence per line (the sacreBLEU references).

A corpus spec lists each split's *sources* (``splits`` for download mode, ``local.splits`` for a
local directory): a file (plain or ``.gz``) or a member of a downloaded ``.tgz`` / ``.zip``, in a
*format* (:func:`extract`); a source may record the sha256 of its content per language.  The
split's text is the concatenation of its sources.
"""

import gzip
import html
import os
import re
import tarfile
import zipfile

from mt_pipeline.prep.fetch import content_sha256
from mt_pipeline.prep.textio import report_problems, write_lines_atomic
from mt_pipeline.prep.tok import split_recipe

FORMATS = "plain, seg, sgm, iwslt_tags, tmx:LANG, bars:N, tsv:N"
_SEG = re.compile(r'<seg id="[0-9]*">\s*')
_SEG_END = re.compile(r"\s*</seg>\s*")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f]")  # the C0 controls but tab: what line_problems refuses


def extract(text, fmt, src=None):
    """Lines of one source ``text`` in format ``fmt``.

    ``plain``: one sentence per line.  ``seg``: the fairseq recipe for IWSLT XML / WMT sgm
    (``grep '<seg id' | sed 's/<seg id="[0-9]*">\\s*//; s/\\s*<\\/seg>\\s*//'``), no unescaping, as
    prepare-iwslt14.sh / prepare-wmt14en2de.sh do.  ``sgm``: the segments of a WMT sgm file
    HTML-unescaped (as sacreBLEU reads them).  ``iwslt_tags``: an IWSLT ``train.tags`` file
    (lines with ``<url>``, ``<talkid>``, ``<keywords>`` dropped; ``<title>``/``<description>``
    tags removed, every other line kept -- exactly prepare-iwslt14.sh's grep/sed chain).
    ``tmx:LANG``: the ``<seg>`` of every ``<tuv xml:lang="LANG">``.  ``bars:N``: field N of
    ``a ||| b ||| c`` lines, split on ``|||`` and stripped (ASPEC; WMT's wiki-headlines titles, as
    tensorflow-datasets reads them).  ``tsv:N``: column N of a TSV file.

    Raises:
        SystemExit: unknown format (names the valid ones); a ``bars:N``/``tsv:N`` line with fewer
            fields (names the line).
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if fmt == "plain":
        return [l.rstrip("\r") for l in lines]
    if fmt == "seg":
        return [_SEG_END.sub("", _SEG.sub("", l)) for l in lines if "<seg id" in l]
    if fmt == "sgm":
        out = []
        for l in lines:
            m = re.search(r"<seg[^>]*>(.*)</seg>", l)
            if m:
                out.append(html.unescape(m.group(1).strip()))
        return out
    if fmt == "iwslt_tags":
        out = []
        for l in lines:
            if "<url>" in l or "<talkid>" in l or "<keywords>" in l:
                continue
            for t in ("<title>", "</title>", "<description>", "</description>"):
                l = l.replace(t, "")
            out.append(l)
        return out
    if fmt.startswith("tmx:"):
        want, out, cur = fmt.split(":")[1], [], None
        for l in lines:
            m = re.search(r'<tuv[^>]*xml:lang="([^"]+)"', l)
            if m:
                cur = m.group(1)
            m = re.search(r"<seg>(.*)</seg>", l)
            if m and cur == want:
                out.append(html.unescape(m.group(1)).strip())
        return out
    for kind, sep, name in (("bars:", "|||", "'|||'-separated fields"), ("tsv:", "\t", "tab-separated columns")):
        if fmt.startswith(kind):
            try:
                col = int(fmt.split(":")[1])
            except ValueError:
                raise SystemExit(f"source format '{fmt}': {kind} takes a column number (e.g. {kind}1)") from None
            out = []
            for n, l in enumerate(lines, 1):
                fields = l.split(sep)
                if col >= len(fields):
                    raise SystemExit(f"line {n}: {len(fields)} {name}, format '{fmt}' needs field {col} "
                                     f"(counting from 0): {l[:80]!r}")
                out.append(fields[col].strip() if kind == "bars:" else fields[col])
            return out
    raise SystemExit(f"unknown source format '{fmt}'; valid: {FORMATS}")


def read_member(archive, member):
    """The bytes of ``member`` of a ``.zip`` or tar ``archive`` (decompressed when it is a ``.gz``).

    Raises:
        KeyError: no such member."""
    if archive.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            return z.read(member)
    with tarfile.open(archive) as t:
        f = t.extractfile(member)
        if f is None:
            raise KeyError(f"{member} not found in {archive}")
        data = f.read()
    return gzip.decompress(data) if member.endswith(".gz") else data


class Sources:
    """The sources of a spec's splits in one mode.

    Args:
        spec: the corpus spec.
        mode: ``local`` (files under ``local_dir``, spec section ``local.splits``) or ``download``
            (files and archives under ``download_dir``, spec section ``splits``).
        verify: check the recorded sha256 of a source's content (``--no-checksum``: False).
    """

    def __init__(self, spec, mode, local_dir, download_dir, verify=True):
        self.spec, self.mode, self.local_dir, self.download_dir = spec, mode, local_dir, download_dir
        self.langs, self.verify = list(spec["langs"]), verify

    def side(self, src, lang):
        """Template fields of a source's file name: ``side`` = src or ref for ``lang`` (WMT sgm)."""
        return {"side": "src" if lang == src.get("src_lang", self.langs[0]) else "ref"}

    def path_of(self, src, lang):
        """The file (or archive member) of source ``src`` for ``lang``."""
        return src["file"].format(lang=lang, **self.side(src, lang))

    def of(self, split):
        """The sources of ``split`` (list of dicts), or None when the split is not available here
        (not in the mode's section, or an optional local split whose files are absent)."""
        if self.mode == "download":
            return self.spec["splits"].get(split)
        srcs = self.spec["local"]["splits"].get(split)
        if srcs and all(x.get("optional") for x in srcs) and not all(
                os.path.exists(os.path.join(self.local_dir, self.path_of(x, l))) for x in srcs for l in self.langs):
            return None
        return srcs

    def fingerprint(self, splits):
        """The inputs of ``splits`` in one line, for the raw stage's stamp: the checksum setting
        and ``PATH:SIZE:MTIME`` of every source file or archive (a missing one as ``PATH:-``), so
        another ``--local-dir``, changed files or ``--no-checksum`` re-run the stage."""
        paths = set()
        for split in splits:
            for src in self.of(split) or []:
                for lang in self.langs:
                    if "archive" in src:
                        paths.add(os.path.join(self.download_dir, src["archive"]))
                    else:
                        base = self.local_dir if self.mode == "local" else self.download_dir
                        paths.add(os.path.join(base, self.path_of(src, lang)))

        def one(p):
            if not os.path.exists(p):
                return f"{os.path.abspath(p)}:-"
            st = os.stat(p)
            return f"{os.path.abspath(p)}:{st.st_size}:{st.st_mtime_ns // 10**9}"

        return f"checksum={'on' if self.verify else 'off'} " + " ".join(one(p) for p in sorted(paths))

    def describe(self, srcs, lang):
        """The sources ``srcs`` of ``lang`` in one line (for the plan)."""
        return " + ".join((x.get("archive", "") + ":" if "archive" in x else "") + self.path_of(x, lang)
                          + f" [{x.get('format', 'plain')}]" + (f" (first {x['lines']} lines)" if "lines" in x else "")
                          for x in srcs)

    def read(self, src, lang):
        """The lines of one source for ``lang`` (its first ``src["lines"]`` lines when the source
        says ``lines: N``; ASPEC's training files are ordered by alignment score, so a prefix is a
        selection by score).

        Raises:
            SystemExit: a missing file or member, a content sha256 other than the recorded one,
            invalid UTF-8 or a line without the format's field (each names the file and line)."""
        rel = self.path_of(src, lang)
        if "archive" in src:
            arch = os.path.join(self.download_dir, src["archive"])
            if not os.path.exists(arch):
                raise SystemExit(f"missing download {arch}")
            try:
                data = read_member(arch, rel)
            except KeyError as err:
                raise SystemExit(str(err).strip("'\"")) from None
        else:
            base = self.local_dir if self.mode == "local" else self.download_dir
            path = os.path.join(base, rel)
            if not os.path.exists(path):
                raise SystemExit(f"missing input {path} (expected in "
                                 f"{'--local-dir' if self.mode == 'local' else 'download/'})")
            with open(path, "rb") as f:
                data = f.read()
            if path.endswith(".gz"):
                data = gzip.decompress(data)
            want = (src.get("sha256") or {}).get(lang) if isinstance(src.get("sha256"), dict) else None
            if want and self.verify and content_sha256(data) != want:
                raise SystemExit(f"sha256 mismatch for the content of {path}: expected {want}, got "
                                 f"{content_sha256(data)} (use --no-checksum to accept other files)")
        where = f"{arch}:{rel}" if "archive" in src else path
        try:
            text = data.decode("utf-8-sig" if src.get("bom") else "utf-8")
        except UnicodeDecodeError as err:
            line = data[:err.start].count(b"\n") + 1
            raise SystemExit(f"{where}:{line}: invalid UTF-8 at byte {err.start}") from None
        # a format may name the language or the column: tmx:{lang}, bars:{col} (spec key `columns`)
        try:
            lines = extract(text, src.get("format", "plain").format(lang=lang, col=src.get("columns", {}).get(lang, "")),
                            src)
        except SystemExit as err:
            raise SystemExit(f"{where}: {err}") from None
        if "lines" in src:
            if len(lines) < src["lines"]:
                raise SystemExit(f"{where}: has {len(lines)} lines, fewer than the {src['lines']} the spec takes "
                                 "(`lines:`)")
            lines = lines[:src["lines"]]
        return lines


def line_problems(split, per_lang, allow_empty=False):
    """Problems of one split's extracted lines (``{lang: [str]}``), each naming the split,
    language and 1-based line: a NUL or other C0 control character but tab (the tokeniser would
    join the words around it), and -- unless ``allow_empty`` (train cleaned by clean-corpus-n,
    which drops such pairs) -- an empty or whitespace-only line (an empty sentence fairseq pairs
    with its neighbour's translation or drops).  (The training split of a recipe with
    ``remove_non_printing`` has its control characters replaced first: :func:`blank_controls`.)"""
    problems = []
    for lang, lines in per_lang.items():
        for n, line in enumerate(lines, 1):
            bad = _CONTROL.search(line)
            bad = bad and bad.group()
            if bad:
                problems.append(f"{split}.{lang}:{n}: control character {bad!r} (a NUL or control byte in the "
                                "source; the tokeniser would join the words around it)")
            elif not allow_empty and not line.strip():
                problems.append(f"{split}.{lang}:{n}: empty line")
    return problems


def blanks_controls(spec, split):
    """Whether the raw stage replaces the C0 control characters (but tab) of ``split`` by spaces
    instead of refusing them: only for ``train``, and only when the spec's recipe applies
    ``remove_non_printing`` to train -- the tokeniser then turns every such character into a space
    anyway (fairseq's remove-non-printing-char.perl), so one stray byte in millions of web-crawled
    training lines is noise, not a broken input.  Dev and test sets (the BLEU references) and
    recipes without it keep the strict check."""
    return split == "train" and bool(split_recipe(spec.get("recipe") or {}, "train").get("remove_non_printing"))


def blank_controls(per_lang):
    """Replace every C0 control character but tab (NUL, BEL, an inner CR, ...) of ``{lang: [str]}``
    by a space, in place; returns ``{lang: (characters replaced, lines with one, first such 1-based
    line or None)}``."""
    counts = {}
    for lang, lines in per_lang.items():
        chars = nlines = 0
        first = None
        for i, line in enumerate(lines):
            new, k = _CONTROL.subn(" ", line)
            if k:
                lines[i] = new
                chars, nlines = chars + k, nlines + 1
                first = first or i + 1
        counts[lang] = (chars, nlines, first)
    return counts


def write_splits(run, sources, splits, d):
    """The body of the raw stage of a spec corpus: every split of ``splits`` extracted from its
    sources -> ``d/SPLIT.LANG``; the languages of a split must have equal line counts.

    Raises:
        SystemExit: a bad source (see :meth:`Sources.read`), unequal line counts, or bad text
        (:func:`line_problems`: control characters, empty lines) -- every split is read and
        checked before the first one is written, so a refused input leaves no split behind.
        Control characters in train are replaced by spaces and counted instead when the recipe
        removes non-printing characters from train (:func:`blanks_controls`)."""
    ready = []
    for s in splits:
        srcs, per_lang = sources.of(s), {}
        for lang in sources.langs:
            run.step(f"extract {s}.{lang} from {sources.describe(srcs, lang)}")
            if not run.dry:
                try:
                    per_lang[lang] = [line for x in srcs for line in sources.read(x, lang)]
                except SystemExit as err:
                    run.die(f"raw: {err}; nothing written to {d}")
        if run.dry:
            continue
        n = {lang: len(v) for lang, v in per_lang.items()}
        if len(set(n.values())) != 1:
            run.die(f"raw: {s} has different line counts per language: {n}; nothing written to {d}")
        cleaned = s == "train" and bool((sources.spec.get("recipe") or {}).get("clean"))
        if blanks_controls(sources.spec, s):
            for lang, (k, nl, first) in blank_controls(per_lang).items():
                if k:
                    run.log(f"raw/{s}.{lang}: replaced {k} control character{'s' * (k != 1)} in {nl} "
                            f"line{'s' * (nl != 1)} by spaces (first: line {first}); the recipe's "
                            "remove_non_printing makes them spaces in tok/ anyway")
        problems = line_problems(s, per_lang, allow_empty=cleaned)
        if problems:
            report_problems(problems, "raw")
            run.die(f"raw: bad text in {s} (see above; the sources: "
                    f"{'; '.join(sources.describe(srcs, lang) for lang in sources.langs)}); nothing written to {d}")
        ready.append((s, per_lang))
    for s, per_lang in ready:
        for lang in sources.langs:
            write_lines_atomic(os.path.join(d, f"{s}.{lang}"), per_lang[lang])
        run.log(f"raw/{s}: {len(per_lang[sources.langs[0]])} pairs")
