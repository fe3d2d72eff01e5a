#!/usr/bin/python3
"""Checks that every relative link and #anchor in README.md and docs/*.md resolves.

A link is `[text](target)` or `![alt](target)` outside code; `http:`, `https:` and
`mailto:` targets are not followed. A target's path must exist (relative to the file that
links it); a `#anchor` must be the slug of a heading of the target Markdown file, by
GitHub's rules: lowercase, punctuation dropped (letters, digits, spaces, '-' and '_' kept),
spaces turned into '-', a repeated slug suffixed -1, -2, ...

Usage: check-docs.py [ROOT]      check ROOT (default: the repository)
       check-docs.py --self-test  show that a broken link and a broken anchor are found
Exit status 1 when a link does not resolve, with each one named as FILE:LINE: problem.
"""

import os
import re
import sys
import tempfile

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    # Links in a heading keep their text only.
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def lines_outside_code(text):
    """(line number, line) pairs that are not in fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def anchors(path, cache):
    """The anchors of the Markdown file at `path`."""
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        seen = {}
        found = set()
        for _, line in lines_outside_code(text):
            m = HEADING.match(line)
            if not m:
                continue
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        # Explicit anchors: <a name="x"> or id="x".
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
        cache[path] = found
    return cache[path]


def check_file(path, cache):
    """Problems of one Markdown file, as 'FILE:LINE: message' strings."""
    problems = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    base = os.path.dirname(path)
    for n, line in lines_outside_code(text):
        line = INLINE_CODE.sub("", line)
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: ...
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(base, file_part)) if file_part else path
            if not os.path.exists(dest):
                problems.append(f"{os.path.relpath(path)}:{n}: {target}: no such file {dest}")
                continue
            if anchor:
                if not dest.endswith(".md") or os.path.isdir(dest):
                    problems.append(f"{os.path.relpath(path)}:{n}: {target}: an anchor into a non-Markdown file")
                elif anchor not in anchors(dest, cache):
                    problems.append(f"{os.path.relpath(path)}:{n}: {target}: no heading #{anchor} in {dest}")
    return problems


def check(root):
    """Problems of README.md and docs/*.md under `root`."""
    files = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        files += sorted(
            os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md")
        )
    cache = {}
    problems = []
    for f in files:
        if os.path.exists(f):
            problems += check_file(f, cache)
    return problems


def self_test():
    """A good tree passes; a missing file, a missing anchor each fail."""
    assert slug("`[gateway.timeouts]`") == "gatewaytimeouts", slug("`[gateway.timeouts]`")
    assert slug("Run, reload & drain") == "run-reload--drain"
    assert slug("3a. DSR (`dsr-l2`, the default)") == "3a-dsr-dsr-l2-the-default"
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "docs"))

        def write(name, text):
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)

        write("docs/a.md", "# A\n\n## Run, reload & drain\n\n## Same\n\n## Same\n")
        write(
            "README.md",
            "# R\n\n[a](docs/a.md#run-reload--drain) [b](docs/a.md#same-1) [c](#r)\n"
            "`[not](a link)`\n\n```\n[not](in code)\n```\n[web](https://example.com/x)\n",
        )
        good = check(root)
        assert good == [], good
        write("README.md", "# R\n\n[gone](docs/missing.md)\n")
        bad = check(root)
        assert len(bad) == 1 and "no such file" in bad[0], bad
        write("README.md", "# R\n\n[x](docs/a.md#no-such-heading) [y](#nor-this)\n")
        bad = check(root)
        assert len(bad) == 2 and all("no heading" in b for b in bad), bad
    print("check-docs self-test: a broken link and a broken anchor are both found")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = check(os.path.normpath(root))
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} link(s) do not resolve", file=sys.stderr)
        return 1
    print("docs: every relative link and anchor resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
