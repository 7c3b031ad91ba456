"""Stage raw: the detokenized text of every split, one sentence per line (the sacreBLEU references).

A corpus spec lists each split's *sources* (``splits`` for download mode, ``local.splits`` for a
local directory): a file (plain or ``.gz``) or a member of a downloaded ``.tgz`` / ``.zip``, in a
*format* (:func:`extract_lines`); a source may record the sha256 of its content per language.  The
split's text is the concatenation of its sources.  Sources are streamed (:meth:`Sources.lines`:
a file or archive member is read in blocks of lines, never whole).
"""

import contextlib
import gzip
import hashlib
import html
import os
import re
import tarfile
import zipfile

from mt_pipeline.prep.textio import lines_writer, report_problems
from mt_pipeline.prep.tok import split_recipe

FORMATS = "plain, seg, sgm, iwslt_tags, tmx:LANG, bars:N, tsv:N"
_SEG = re.compile(r'<seg id="[0-9]*">\s*')
_SEG_END = re.compile(r"\s*</seg>\s*")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f]")  # the C0 controls but tab: what line_problems refuses
READ_BLOCK = 1 << 20  # bytes of whole lines a source is read and decoded in


def extract(text, fmt, src=None):
    """Lines of one source ``text`` (str) in format ``fmt``: :func:`extract_lines` on its lines
    (split on ``\\n``; a final ``\\n`` ends the last line)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return list(extract_lines(lines, fmt))


def extract_lines(lines, fmt):
    """The lines of one source in format ``fmt``, from its text's ``lines`` (any iterable of str
    without their ``\\n``; a generator: a source is streamed).

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
    if fmt == "plain":
        for l in lines:
            yield l.rstrip("\r")
    elif fmt == "seg":
        for l in lines:
            if "<seg id" in l:
                yield _SEG_END.sub("", _SEG.sub("", l))
    elif fmt == "sgm":
        for l in lines:
            m = re.search(r"<seg[^>]*>(.*)</seg>", l)
            if m:
                yield html.unescape(m.group(1).strip())
    elif fmt == "iwslt_tags":
        for l in lines:
            if "<url>" in l or "<talkid>" in l or "<keywords>" in l:
                continue
            for t in ("<title>", "</title>", "<description>", "</description>"):
                l = l.replace(t, "")
            yield l
    elif fmt.startswith("tmx:"):
        want, cur = fmt.split(":")[1], None
        for l in lines:
            m = re.search(r'<tuv[^>]*xml:lang="([^"]+)"', l)
            if m:
                cur = m.group(1)
            m = re.search(r"<seg>(.*)</seg>", l)
            if m and cur == want:
                yield html.unescape(m.group(1)).strip()
    else:
        for kind, sep, name in (("bars:", "|||", "'|||'-separated fields"), ("tsv:", "\t", "tab-separated columns")):
            if fmt.startswith(kind):
                try:
                    col = int(fmt.split(":")[1])
                except ValueError:
                    raise SystemExit(f"source format '{fmt}': {kind} takes a column number (e.g. {kind}1)") from None
                for n, l in enumerate(lines, 1):
                    fields = l.split(sep)
                    if col >= len(fields):
                        raise SystemExit(f"line {n}: {len(fields)} {name}, format '{fmt}' needs field {col} "
                                         f"(counting from 0): {l[:80]!r}")
                    yield fields[col].strip() if kind == "bars:" else fields[col]
                return
        raise SystemExit(f"unknown source format '{fmt}'; valid: {FORMATS}")


@contextlib.contextmanager
def open_member(archive, member):
    """``member`` of a ``.zip`` or tar ``archive`` as a binary file streamed from the archive (a tar
    member ending in ``.gz`` decompressed).

    Raises:
        KeyError: no such member."""
    with contextlib.ExitStack() as stack:
        if archive.endswith(".zip"):
            yield stack.enter_context(stack.enter_context(zipfile.ZipFile(archive)).open(member))
            return
        f = stack.enter_context(tarfile.open(archive)).extractfile(member)
        if f is None:
            raise KeyError(f"{member} not found in {archive}")
        yield stack.enter_context(gzip.GzipFile(fileobj=f)) if member.endswith(".gz") else f


def read_member(archive, member):
    """The bytes of ``member`` of a ``.zip`` or tar ``archive`` (:func:`open_member`).

    Raises:
        KeyError: no such member."""
    with open_member(archive, member) as f:
        return f.read()


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
        """:meth:`lines` of one source for ``lang`` as a list (small sources; a stage streams them)."""
        return list(self.lines(src, lang))

    @contextlib.contextmanager
    def _open(self, src, lang):
        """``(binary file, name for messages, expected content sha256 or None)`` of one source."""
        rel = self.path_of(src, lang)
        if "archive" in src:
            arch = os.path.join(self.download_dir, src["archive"])
            if not os.path.exists(arch):
                raise SystemExit(f"missing download {arch}")
            with contextlib.ExitStack() as stack:
                try:
                    f = stack.enter_context(open_member(arch, rel))
                except KeyError as err:
                    raise SystemExit(str(err).strip("'\"")) from None
                yield f, f"{arch}:{rel}", None
            return
        base = self.local_dir if self.mode == "local" else self.download_dir
        path = os.path.join(base, rel)
        if not os.path.exists(path):
            raise SystemExit(f"missing input {path} (expected in "
                             f"{'--local-dir' if self.mode == 'local' else 'download/'})")
        want = (src.get("sha256") or {}).get(lang) if isinstance(src.get("sha256"), dict) else None
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            yield f, path, want if self.verify else None

    def lines(self, src, lang):
        """The lines of one source for ``lang``, streamed (a generator): its file or archive member
        read line by line (split on ``\\n`` only), decoded, extracted by its format
        (:func:`extract_lines`); its first ``src["lines"]`` lines when the source says ``lines: N``
        (ASPEC's training files are ordered by alignment score, so a prefix is a selection by
        score).  A recorded sha256 is checked on the whole content (the rest of the file is read
        when ``lines: N`` stops early, and before any other error is reported).

        Raises:
            SystemExit: a missing file or member, a content sha256 other than the recorded one,
            invalid UTF-8 or a line without the format's field (each names the file and line)."""
        with self._open(src, lang) as (f, where, want):
            h = hashlib.sha256() if want else None

            at = [0, 0]  # lines and bytes decoded so far; after a UTF-8 error: the bad line and where it starts

            def decoded():  # blocks of whole lines (READ_BLOCK bytes), decoded at once
                for block in iter(lambda: f.readlines(READ_BLOCK), []):
                    data = b"".join(block)
                    if h is not None:
                        h.update(data)
                    try:
                        text = data.decode("utf-8-sig" if at[0] == 0 and src.get("bom") else "utf-8")
                    except UnicodeDecodeError:
                        for raw in block:  # which line: decoding it raises the error of that line
                            at[0] += 1
                            raw.decode("utf-8-sig" if at[0] == 1 and src.get("bom") else "utf-8")
                            at[1] += len(raw)
                        raise
                    at[0], at[1] = at[0] + len(block), at[1] + len(data)
                    lines = text.split("\n")
                    if lines[-1] == "":
                        lines.pop()  # the end of the block's last line, not a line
                    yield from lines

            def checksum_error():
                """The sha256 mismatch (the whole content read), or None."""
                if h is None:
                    return None
                for raw in f:  # what is left after an error or a `lines: N` prefix
                    h.update(raw)
                got = h.hexdigest()
                return None if got == want else SystemExit(
                    f"sha256 mismatch for the content of {where}: expected {want}, got {got} "
                    "(use --no-checksum to accept other files)")

            limit, n = src.get("lines"), 0
            # a format may name the language or the column: tmx:{lang}, bars:{col} (spec key `columns`)
            fmt = src.get("format", "plain").format(lang=lang, col=src.get("columns", {}).get(lang, ""))
            try:
                for line in extract_lines(decoded(), fmt):
                    n += 1
                    yield line
                    if limit is not None and n >= limit:
                        break
            except UnicodeDecodeError as err:
                raise checksum_error() or SystemExit(
                    f"{where}:{at[0]}: invalid UTF-8 at byte {at[1] + err.start}") from None
            except SystemExit as err:
                raise checksum_error() or SystemExit(f"{where}: {err}") from None
            bad = checksum_error()
            if bad:
                raise bad
            if limit is not None and n < limit:
                raise SystemExit(f"{where}: has {n} lines, fewer than the {limit} the spec takes (`lines:`)")


def line_problem(name, n, line, allow_empty=False):
    """The problem of line ``n`` (1-based) of ``name`` (``SPLIT.LANG``), or None: see :func:`line_problems`."""
    bad = _CONTROL.search(line)
    if bad:
        return (f"{name}:{n}: control character {bad.group()!r} (a NUL or control byte in the "
                "source; the tokeniser would join the words around it)")
    if not allow_empty and not line.strip():
        return f"{name}:{n}: empty line"
    return None


def line_problems(split, per_lang, allow_empty=False):
    """Problems of one split's extracted lines (``{lang: [str]}``), each naming the split,
    language and 1-based line: a NUL or other C0 control character but tab (the tokeniser would
    join the words around it), and -- unless ``allow_empty`` (train cleaned by clean-corpus-n,
    which drops such pairs) -- an empty or whitespace-only line (an empty sentence fairseq pairs
    with its neighbour's translation or drops).  (The training split of a recipe with
    ``remove_non_printing`` has its control characters replaced first: :func:`write_splits`.)"""
    found = (line_problem(f"{split}.{lang}", n, line, allow_empty)
             for lang, lines in per_lang.items() for n, line in enumerate(lines, 1))
    return [p for p in found if p]


def blanks_controls(spec, split):
    """Whether the raw stage replaces the C0 control characters (but tab) of ``split`` by spaces
    instead of refusing them: only for ``train``, and only when the spec's recipe applies
    ``remove_non_printing`` to train -- the tokeniser then turns every such character into a space
    anyway (fairseq's remove-non-printing-char.perl), so one stray byte in millions of web-crawled
    training lines is noise, not a broken input.  Dev and test sets (the BLEU references) and
    recipes without it keep the strict check."""
    return split == "train" and bool(split_recipe(spec.get("recipe") or {}, "train").get("remove_non_printing"))


def write_splits(run, sources, splits, d):
    """The body of the raw stage of a spec corpus: every split of ``splits`` extracted from its
    sources -> ``d/SPLIT.LANG``; the languages of a split must have equal line counts.  Streamed:
    each source is read line by line (:meth:`Sources.lines`) into a temp file, checked on the way;
    the temp files replace ``d/SPLIT.LANG`` once every split has been read and checked.

    Raises:
        SystemExit: a bad source (see :meth:`Sources.lines`), unequal line counts, or bad text
        (:func:`line_problems`: control characters, empty lines) -- every split is read and
        checked before the first one is written, so a refused input leaves no split behind.
        Control characters in train are replaced by spaces and counted instead when the recipe
        removes non-printing characters from train (:func:`blanks_controls`)."""
    limit, counts = 20, {}
    with contextlib.ExitStack() as pending:  # the temp files: replace d/SPLIT.LANG at the end, or are removed
        for s in splits:
            srcs, n, blanked = sources.of(s), {}, {}
            blank = blanks_controls(sources.spec, s)
            cleaned = s == "train" and bool((sources.spec.get("recipe") or {}).get("clean"))
            problems, nproblems = [], 0
            for lang in sources.langs:
                run.step(f"extract {s}.{lang} from {sources.describe(srcs, lang)}")
                if run.dry:
                    continue
                out = pending.enter_context(lines_writer(os.path.join(d, f"{s}.{lang}")))
                k = chars = nl = 0
                first = None
                try:
                    for x in srcs:
                        for line in sources.lines(x, lang):
                            k += 1
                            if blank:
                                line, c = _CONTROL.subn(" ", line)
                                if c:
                                    chars, nl, first = chars + c, nl + 1, first or k
                            problem = line_problem(f"{s}.{lang}", k, line, cleaned)
                            if problem:
                                nproblems += 1
                                if len(problems) < limit:
                                    problems.append(problem)
                            out.write(line + "\n")
                except SystemExit as err:
                    run.die(f"raw: {err}; nothing written to {d}")
                n[lang], blanked[lang] = k, (chars, nl, first)
            if run.dry:
                continue
            if len(set(n.values())) != 1:
                run.die(f"raw: {s} has different line counts per language: {n}; nothing written to {d}")
            for lang, (k, nl, first) in blanked.items():
                if k:
                    run.log(f"raw/{s}.{lang}: replaced {k} control character{'s' * (k != 1)} in {nl} "
                            f"line{'s' * (nl != 1)} by spaces (first: line {first}); the recipe's "
                            "remove_non_printing makes them spaces in tok/ anyway")
            if problems:
                report_problems(problems, "raw", limit, total=nproblems)
                run.die(f"raw: bad text in {s} (see above; the sources: "
                        f"{'; '.join(sources.describe(srcs, lang) for lang in sources.langs)}); nothing written to {d}")
            counts[s] = n[sources.langs[0]]
    for s, k in counts.items():
        run.log(f"raw/{s}: {k} pairs")
