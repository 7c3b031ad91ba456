"""Inputs: the one download and checksum implementation of the data preparation.

Every corpus spec lists its official files (``downloads``: URL, file name under
``<out>/download/``, a sha256 -- or the md5 sacreBLEU records for its test sets, or ``unverified``
where nothing is published).  A download is streamed into a temporary file, hashed on the way,
and moved into place only when its checksum matches: a wrong checksum or a broken connection
leaves no file behind.  A file already in ``download/`` with the right checksum is not fetched
again.  An ``unverified`` checksum is computed on the first download and stored in
``download/CHECKSUMS`` (checked on later runs).  Local inputs are checked with :func:`~mt_pipeline.provenance.file_sha256`
(the file) or :func:`content_sha256` (the decompressed content of a ``.gz``).
"""

import gzip
import hashlib
import http.client
import os
import time
import urllib.error
import urllib.request

from mt_pipeline.atomic import atomic_path, write_text_atomic
from mt_pipeline.provenance import file_sha256

UNVERIFIED = "unverified"


class FetchError(Exception):
    """A download failed (network, HTTP error); no file was written."""


class ChecksumError(Exception):
    """A file's checksum is not the recorded one; a download with it was not kept."""


class _ShortRead(Exception):
    """The body of a response ended before its ``Content-Length`` (retried like a network error)."""


def check_complete(path):
    """Read an archive or compressed file to its end (``.gz``, ``.tgz``/``.tar.*``, ``.zip``) so
    that a cut-short download is found before its checksum is pinned; other files pass.

    Raises:
        ChecksumError: the file ends early or is corrupt (names it)."""
    import tarfile
    import zipfile

    name = path.lower()
    try:
        if name.endswith((".tgz", ".tar.gz", ".tar.bz2", ".tar.xz", ".tar")):
            with tarfile.open(path) as t:
                for member in t:
                    if member.isfile():
                        f = t.extractfile(member)
                        while f.read(1 << 20):  # (in blocks: a WMT archive member is GBs)
                            pass
        elif name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
        elif name.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
            if bad:
                raise ChecksumError(f"{path}: member {bad} is corrupt")
    except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile) as err:
        raise ChecksumError(f"{path} is cut short or corrupt ({err})") from None


def read_content(path):
    """The bytes of ``path``, decompressed when it ends in ``.gz``."""
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if path.endswith(".gz") else data


def content_sha256(data):
    """Hex sha256 of ``data`` (bytes): the checksum of a file's uncompressed content."""
    return hashlib.sha256(data).hexdigest()


def expected_checksum(item):
    """``(algo, value)`` a spec download records: sha256, else md5, else ``('sha256', 'unverified')``."""
    for algo in ("sha256", "md5"):
        if item.get(algo):
            return algo, item[algo]
    return "sha256", UNVERIFIED


def download(url, dest, algo="sha256", expected=None, retries=3, timeout=60):
    """Download ``url`` (http(s), ftp or file://) to ``dest``; return its hex digest.

    The data is streamed into a temporary file next to ``dest`` and hashed on the way; ``dest``
    is replaced only when the digest equals ``expected`` (any digest when ``expected`` is None or
    ``'unverified'``).  Network errors are retried ``retries`` times (HTTP 4xx are not).

    Raises:
        FetchError: the download failed, or ended before its ``Content-Length`` (``dest``
            untouched, no temp file left).
        ChecksumError: the digest differs from ``expected`` (``dest`` untouched, no temp file left).
    """
    with atomic_path(dest) as tmp:
        for attempt in range(1, retries + 1):
            h = hashlib.new(algo)
            try:
                with urllib.request.urlopen(url, timeout=timeout) as r, open(tmp, "wb") as f:
                    size = 0
                    for block in iter(lambda: r.read(1 << 20), b""):
                        f.write(block)
                        h.update(block)
                        size += len(block)
                    length = r.headers.get("Content-Length")
                    if length and length.isdigit() and not r.headers.get("Content-Encoding") and size != int(length):
                        # the server closed early (or sent more): never keep, nor pin, a short file
                        raise _ShortRead(f"cut short: got {size} of the {length} bytes its Content-Length announced")
                break
            except (urllib.error.URLError, OSError, _ShortRead, http.client.HTTPException) as err:
                client_error = isinstance(err, urllib.error.HTTPError) and 400 <= err.code < 500
                if client_error or attempt == retries:
                    raise FetchError(f"download failed: {url} ({err})") from None
                time.sleep(2 ** attempt)
        got = h.hexdigest()
        if expected not in (None, UNVERIFIED) and got != expected:
            raise ChecksumError(f"{algo} mismatch for {url}: expected {expected}, got {got}; the download was "
                                "not kept")
    return got


def print_sources(run, items):
    """Print the official sources: URL, file under download/, checksum and where it comes from."""
    run.log("official sources (URL, checksum, where the checksum comes from):")
    for d in items:
        algo, val = expected_checksum(d)
        print(f"    {d['url']}\n        -> download/{d['file']}  {algo}:{val}  ({d.get('checksum_source', 'recorded')})")
        if d.get("note"):
            print(f"        note: {d['note']}")


def _read_store(path):
    stored = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    stored[parts[1]] = parts[0]
    return stored


def _check_before_pinning(run, path, item, downloaded):
    """Stop when an unverified file is cut short: its checksum would be pinned in
    ``download/CHECKSUMS`` and refuse every later, complete download.  A file this run has just
    ``downloaded`` is removed; one found there is left for the user to move away."""
    try:
        check_complete(path)
    except ChecksumError as err:
        if downloaded:
            os.unlink(path)
            what = f"removed it (run again to download it again from {item['url']})"
        else:
            what = f"move it away and run again to download it from {item['url']}"
        run.die(f"{err}; no checksum is published for {item['file']}, so its checksum is not recorded: {what}")


def fetch_all(run, items, ddir, verify=True, hint="pass --local-dir DIR holding {file}"):
    """Make every spec download ``items`` present in ``ddir`` with its recorded checksum.

    A file there with the right checksum is kept ("have download/F"); any other is downloaded
    (a dry run prints "would download URL -> download/F").  ``verify=False`` (``--no-checksum``)
    keeps a download whose checksum differs, with a warning.  Checksums marked ``unverified`` are
    computed on the first download and kept in ``ddir/CHECKSUMS`` -- only after the file was read
    to its end (:func:`check_complete`), so a cut-short archive is never pinned.

    Raises:
        SystemExit: a download failed or has another checksum (``hint`` says what else to do,
            ``{file}`` in it standing for the file's name);
        nothing is left in ``ddir`` for that file.
    """
    store = os.path.join(ddir, "CHECKSUMS")
    stored = _read_store(store)
    new = False
    for d in items:
        path = os.path.join(ddir, d["file"])
        algo, val = expected_checksum(d)
        if val == UNVERIFIED:
            val = stored.get(d["file"], UNVERIFIED)
        if os.path.exists(path) and (val == UNVERIFIED or file_sha256(path, algo) == val):
            run.log(f"have download/{d['file']}" + ("" if val == UNVERIFIED else f" ({algo} ok)"))
            if val == UNVERIFIED and d["file"] not in stored:
                _check_before_pinning(run, path, d, downloaded=False)
                stored[d["file"]], new = file_sha256(path), True
            continue
        run.step(f"download {d['url']} -> download/{d['file']}")
        if run.dry:
            continue
        try:
            got = download(d["url"], path, algo, None if not verify else val)
        except FetchError as err:
            run.die(f"{err} ({hint.format(file=d['file'])})")
        except ChecksumError as err:
            pinned = "" if expected_checksum(d)[1] != UNVERIFIED else (
                f"; no checksum is published for {d['file']}: the one in download/CHECKSUMS was computed on its first "
                "download -- if that download was incomplete, remove its line there")
            run.die(f"{err}{pinned} (use --no-checksum to accept other files, or {hint.format(file=d['file'])})")
        if val != UNVERIFIED and got != val:
            run.warn(f"{algo} of download/{d['file']} is {got}, not the recorded {val} (kept: --no-checksum)")
        if val == UNVERIFIED:
            _check_before_pinning(run, path, d, downloaded=True)
            stored[d["file"]], new = file_sha256(path), True
            run.log(f"no recorded checksum for {d['file']}: sha256 {stored[d['file']]} stored in "
                    "download/CHECKSUMS (checked on later runs)")
    if new and not run.dry:
        write_text_atomic(store, "".join(f"{stored[k]} {k}\n" for k in sorted(stored)))
