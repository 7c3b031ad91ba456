"""The commands the documentation gives, found one way for every test that checks them
(``test_documented_commands``: each option of our scripts and of fairseq's; ``test_hydra``: each
``fairseq-hydra-train`` command composes)."""

import re

__all__ = ["documented_commands"]


def documented_commands(path, names):
    """``[(kind, command line)]`` of the commands of one documentation file that start with one of
    ``names`` (a regular expression, e.g. an alternation of script names):

    - Markdown: each line of a fenced code block (``\\`` continuations joined, comment lines and
      trailing `` # ...`` comments dropped) that calls one -- at its start, after ``$ ``, or after a
      shell operator ``;``, ``&``, ``|``, ``(`` -- (kind ``block``); each inline code span that
      starts with one and holds an option (kind ``inline``; a span may wrap lines, as Markdown
      allows: its whitespace is collapsed);
    - any other file (the YAML examples' headers): each comment line that starts with one, ``\\``-
      continued comment lines joined (kind ``comment``).
    """
    name = f"(?:{names})"
    text = open(path, encoding="utf-8").read()
    if not path.endswith(".md"):
        text = re.sub(r"\\\n[#\s]*", " ", text)
        return [("comment", m.strip()) for m in re.findall(rf"(?m)^\s*#\s*({name}\s.*)$", text)]
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.strip()
            if line.startswith("#"):
                continue
            m = re.search(rf"(?:^|[;&|(]\s*|\$ )({name}(?=\s|$).*)", line)
            if m:
                out.append(("block", re.sub(r"\s#\s.*$", "", m.group(1)).strip()))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for paragraph in re.split(r"\n\s*\n", prose):  # a code span never crosses a paragraph
        for span in re.findall(r"`([^`]+)`", paragraph):
            if re.match(rf"{name}\s", span) and " --" in span:
                out.append(("inline", " ".join(span.split())))
    return out
