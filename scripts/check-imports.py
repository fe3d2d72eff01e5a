#!/usr/bin/python3
"""Fails on any import circle between the modules of a crate, and prints the circle.

Usage: check-imports.py [CRATE_DIR ...]   (default: every workspace member and fuzz/)
       check-imports.py --self-test        (finds the circles of made-up crates, passes a
                                            clean one)

For each crate target (src/lib.rs, src/main.rs, src/bin/*.rs) the script reads the module
tree from the `mod` declarations (files `x.rs` or `x/mod.rs`, `#[path]` too; inline
`mod x { ... }` blocks belong to the module around them), then every reference one module
makes to another:

- `use` items (`crate::`, `self::`, `super::`, a child module's name), braces expanded;
- paths in code: `crate::a::b`, `super::x`, and `m::x` where `m` is a module the file
  imported (`use crate::health::{self, ..}` then `health::Checker`) or a child module;
- a name a module re-exports (`pub use controller::Controller` in `kubemodel/mod.rs`) is
  followed to the module that defines it, so `crate::kubemodel::Controller` is an arrow
  into `kubemodel::controller`.

Comments, strings and `#[cfg(test)]` do not matter to it: test modules are part of the
module they sit in, and their imports count (a test that reaches back into a driver
makes the same circle the code would).

It checks two granularities:

- the top-level modules of each crate (`core`, `kube`, `run`, ...), every module below one
  folded into it;
- the submodules of each directory module (`kube/watch.rs` against `kube/pool.rs`), every
  module below one of them folded into it. The directory module's own file (`mod.rs`) is
  not a node at this level: a child naming its parent's items, and the parent re-exporting
  its children, is how a directory module is built. It is a node one level up.

Exit status 1 when a circle exists, with the circle and the lines that make each arrow.
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def strip(text):
    """The source with comments, strings and char literals blanked (line count kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 40]) if c in "rb" and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if m:
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == "'":
            # A char literal ('a', '\n', '\u{..}'), not a lifetime ('a) or a label.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


class Module:
    def __init__(self, path, file, dir_):
        self.path = path  # tuple of names, () for the crate root
        self.file = file  # the file holding the module's items
        self.dir = dir_  # where its child module files live
        self.children = {}
        self.text = ""  # stripped source of the parts of `file` that belong to it
        self.line0 = 0  # line number offset of `text` in `file`
        self.reexports = {}  # name -> full path (tuple) of what it re-exports


def load_tree(root_file):
    """The module tree of one crate target, rooted at `root_file`."""
    mods = {}

    def add(path, file, dir_, text, line0):
        m = Module(path, file, dir_)
        m.text, m.line0 = text, line0
        mods[path] = m
        scan_children(m)
        return m

    def scan_children(m):
        text = m.text
        # `mod x;` declarations (with an optional #[path = ".."] attribute before them) and
        # inline `mod x { .. }` blocks, at any nesting: inline blocks are cut out of the
        # parent's text and become modules of their own.
        pat = re.compile(r'(?:#\[path\s*=\s*("[^"]*"|"")\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*([;{])')
        raw = open(m.file, encoding="utf-8").read()
        pos = 0
        keep = []
        while True:
            hit = pat.search(text, pos)
            if not hit:
                break
            name, kind = hit.group(2), hit.group(3)
            line = m.line0 + text.count("\n", 0, hit.start())
            if kind == ";":
                path_attr = None
                if hit.group(1):
                    # Strings are blanked in `text`; read the attribute from the raw line.
                    raw_line = raw.splitlines()[line] if line < len(raw.splitlines()) else ""
                    pm = re.search(r'#\[path\s*=\s*"([^"]*)"\]', raw_line) or re.search(
                        r'#\[path\s*=\s*"([^"]*)"\]', "\n".join(raw.splitlines()[max(0, line - 2):line + 1]))
                    path_attr = pm.group(1) if pm else None
                if path_attr:
                    f = os.path.normpath(os.path.join(os.path.dirname(m.file), path_attr))
                    d = os.path.join(os.path.dirname(f), os.path.splitext(os.path.basename(f))[0])
                else:
                    f1 = os.path.join(m.dir, name + ".rs")
                    f2 = os.path.join(m.dir, name, "mod.rs")
                    if os.path.exists(f1):
                        f, d = f1, os.path.join(m.dir, name)
                    elif os.path.exists(f2):
                        f, d = f2, os.path.join(m.dir, name)
                    else:
                        pos = hit.end()
                        continue
                child_text = strip(open(f, encoding="utf-8").read())
                m.children[name] = (m.path + (name,))
                add(m.path + (name,), f, d, child_text, 0)
                pos = hit.end()
            else:
                # An inline module: find its closing brace.
                depth, j = 1, hit.end()
                while j < len(text) and depth:
                    if text[j] == "{":
                        depth += 1
                    elif text[j] == "}":
                        depth -= 1
                    j += 1
                body = text[hit.end():j - 1]
                keep.append((hit.start(), j))
                m.children[name] = m.path + (name,)
                add(m.path + (name,), m.file, os.path.join(m.dir, name), body,
                    m.line0 + text.count("\n", 0, hit.end()))
                pos = j
        # The parent keeps its text without the inline children (newlines kept).
        if keep:
            parts, last = [], 0
            for a, b in keep:
                parts.append(text[last:a])
                parts.append("\n" * text.count("\n", a, b))
                last = b
            parts.append(text[last:])
            m.text = "".join(parts)

    f = root_file
    add((), f, os.path.dirname(f), strip(open(f, encoding="utf-8").read()), 0)
    return mods


def use_items(text):
    """Every `use` item in `text`: (offset, is_pub, list of expanded paths with their alias)."""
    out = []
    for hit in re.finditer(r'\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]*);', text):
        body = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", hit.group(2)))
        out.append((hit.start(), bool(hit.group(1)), expand(body)))
    return out


def expand(tree, prefix=()):
    """`a::{b, c::{self, d@e}}` -> [(('a','b'), 'b'), (('a','c'), 'c'), (('a','c','d'), 'e')]

    (`use_items` writes `x as y` as `x@y`)."""
    res = []
    if tree.startswith("::"):
        tree = tree[2:]
    i = tree.find("{")
    if i < 0:
        alias = None
        if "@" in tree:
            tree, alias = tree.split("@", 1)
        full = prefix + tuple(p for p in tree.split("::") if p)
        if not full:
            return res
        last = full[-1]
        if last == "self":
            full = full[:-1]
            last = full[-1] if full else None
        if last == "*":
            res.append((full[:-1], "*"))
        elif last is not None:
            res.append((full, alias or last))
        return res
    head_parts = tuple(p for p in tree[:i].split("::") if p)
    inner = tree[i + 1:tree.rfind("}")]
    depth, start = 0, 0
    pieces = []
    for j, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            pieces.append(inner[start:j])
            start = j + 1
    pieces.append(inner[start:])
    for p in pieces:
        if p:
            res.extend(expand(p, prefix + head_parts))
    return res


def analyse(mods, label):
    """The module-to-module arrows of one crate target, with the lines that make them."""
    # Re-exports first, so paths through them can be followed.
    raw_uses = {}
    for path, m in mods.items():
        items = []
        for off, is_pub, exp in use_items(m.text):
            for full, alias in exp:
                items.append((off, is_pub, full, alias))
        raw_uses[path] = items

    def absolute(cur, parts, aliases):
        """`parts` (a path as written in module `cur`) made absolute, or None if not local."""
        if not parts:
            return None
        head = parts[0]
        if head == "crate":
            return parts[1:]
        if head == "self":
            return cur + parts[1:]
        if head == "super":
            base = cur
            k = 0
            while k < len(parts) and parts[k] == "super":
                base = base[:-1]
                k += 1
            return base + parts[k:]
        if head in mods[cur].children:
            return cur + parts
        if head in aliases:
            return aliases[head] + parts[1:]
        return None

    # Aliases each module brings into scope: name -> absolute path (of a module or an item).
    aliases = {p: {} for p in mods}
    for path, items in raw_uses.items():
        for _ in range(2):
            for off, is_pub, full, alias in items:
                if alias == "*":
                    continue
                a = absolute(path, full, aliases[path])
                if a is not None:
                    aliases[path][alias] = a
                    if is_pub:
                        mods[path].reexports[alias] = a

    def resolve(a):
        """The module an absolute path points into, following re-exports."""
        seen = 0
        while True:
            seen += 1
            node = ()
            k = 0
            while k < len(a) and node + (a[k],) in mods:
                node = node + (a[k],)
                k += 1
            if k < len(a) and a[k] in mods[node].reexports and seen < 20:
                target = mods[node].reexports[a[k]]
                if target == a[:k + 1]:
                    return node
                a = target + a[k + 1:]
                continue
            return node

    edges = defaultdict(list)  # (from, to) -> ["file:line text"]

    def note(cur, target, off):
        if target != cur:
            m = mods[cur]
            line = m.line0 + m.text.count("\n", 0, off) + 1
            src = open(m.file, encoding="utf-8").read().splitlines()
            txt = src[line - 1].strip() if line - 1 < len(src) else ""
            edges[(cur, target)].append("%s:%d: %s" % (os.path.relpath(m.file, ROOT), line, txt[:110]))

    path_re = re.compile(r"(?<![A-Za-z0-9_:$])((?:[A-Za-z_][A-Za-z0-9_]*::)+[A-Za-z_][A-Za-z0-9_]*)")
    for path, m in mods.items():
        for off, is_pub, full, alias in raw_uses[path]:
            a = absolute(path, full, {})
            if a is None and full and full[0] in aliases[path]:
                a = absolute(path, full, aliases[path])
            if a is not None:
                note(path, resolve(a), off)
        # Paths in code (outside `use` items).
        # `use` items blanked (offsets kept): they were counted above.
        text = re.sub(r"\buse\s+[^;]*;", lambda x: re.sub(r"[^\n]", " ", x.group(0)), m.text)
        for hit in path_re.finditer(text):
            parts = tuple(hit.group(1).split("::"))
            a = absolute(path, parts, aliases[path])
            if a is not None:
                note(path, resolve(a), hit.start())
    return edges


def circles(nodes, arrows):
    """Tarjan's strongly connected components with more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(arrows.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def one_circle(comp, arrows):
    """A shortest circle through the first node of a strongly connected component."""
    start = comp[0]
    members = set(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        nxt = []
        for v in queue:
            for w in sorted(arrows.get(v, ())):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        queue = nxt
    return comp


def name(path):
    return "::".join(path) if path else "crate"


def check_target(label, root_file):
    mods = load_tree(root_file)
    edges = analyse(mods, label)
    failed = False
    # Granularities: every module with children is a level; its children are the nodes.
    for parent in sorted(p for p in mods if mods[p].children):
        depth = len(parent)
        arrows = defaultdict(set)
        why = defaultdict(list)
        for (a, b), lines in edges.items():
            if len(a) > depth and len(b) > depth and a[:depth] == parent and b[:depth] == parent:
                ca, cb = a[:depth + 1], b[:depth + 1]
                if ca != cb:
                    arrows[ca].add(cb)
                    why[(ca, cb)].extend(lines)
        nodes = [parent + (c,) for c in mods[parent].children]
        for comp in circles(nodes, arrows):
            failed = True
            circle = one_circle(comp, arrows)
            level = "top-level modules" if not parent else "submodules of %s" % name(parent)
            print("%s: import circle among the %s: %s" % (label, level, " -> ".join(name(c) for c in circle)))
            if len(comp) > len(circle) - 1:
                print("  (all in the circle: %s)" % ", ".join(name(c) for c in comp))
            for a, b in zip(circle, circle[1:]):
                print("  %s -> %s:" % (name(a), name(b)))
                for line in sorted(set(why[(a, b)]))[:4]:
                    print("    " + line)
                extra = len(set(why[(a, b)])) - 4
                if extra > 0:
                    print("    (and %d more)" % extra)
    return failed, len(mods)


def crates(args):
    if args:
        return [os.path.abspath(a) for a in args]
    toml = open(os.path.join(ROOT, "Cargo.toml"), encoding="utf-8").read()
    m = re.search(r"members\s*=\s*\[([^\]]*)\]", toml)
    members = re.findall(r'"([^"]+)"', m.group(1)) if m else []
    extra = [d for d in ("fuzz",) if os.path.isdir(os.path.join(ROOT, d))]
    return [os.path.join(ROOT, d) for d in members + extra]


SELF_TEST = {
    # name: (files, circles expected: a substring of each line naming one)
    "top-level circle through a path in code": ({
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "use crate::b::B;\npub struct A;\n",
        "b.rs": "pub struct B;\nfn f() -> crate::a::A { crate::a::A }\n",
    }, ["top-level modules: a -> b -> a"]),
    "circle through a re-export and an alias": ({
        "lib.rs": "pub mod k;\npub mod core;\n",
        "k/mod.rs": "mod w;\npub use w::P;\n",
        "k/w.rs": "use crate::core;\npub struct P;\nfn f(_: core::E) {}\n",
        "core.rs": "pub enum E { K(crate::k::P) }\n",
    }, ["top-level modules: core -> k -> core"]),
    "sibling circle inside a directory module, through super::": ({
        "lib.rs": "mod d;\n",
        "d/mod.rs": "mod x;\nmod y;\npub use y::Y;\n",
        "d/x.rs": "use super::Y;\npub struct X;\n",
        "d/y.rs": "pub struct Y;\n#[cfg(test)]\nmod tests {\n    use super::super::x::X;\n}\n",
    }, ["submodules of d: d::x -> d::y -> d::x"]),
    "one way, comments and strings ignored": ({
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "// crate::b::B\nuse crate::b::B;\n",
        "b.rs": "/// [`crate::a`]\nconst S: &str = \"crate::a::A\";\n/* crate::a */\n",
    }, []),
}


def self_test():
    import contextlib
    import io
    import tempfile
    bad = 0
    for name, (files, want) in SELF_TEST.items():
        with tempfile.TemporaryDirectory() as d:
            for f, text in files.items():
                path = os.path.join(d, "src", f)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "w", encoding="utf-8").write(text)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                failed, _ = check_target("t", os.path.join(d, "src", "lib.rs"))
            text = out.getvalue()
            ok = failed == bool(want) and all(w in text for w in want)
            print("%s: %s" % ("ok" if ok else "FAILED", name))
            if not ok:
                bad += 1
                print("  want %s, got:\n%s" % (want or "no circle", text))
    if bad:
        sys.exit(1)


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    failed = False
    checked = []
    for crate in crates(sys.argv[1:]):
        src = os.path.join(crate, "src")
        targets = [os.path.join(src, f) for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))]
        bindir = os.path.join(src, "bin")
        if os.path.isdir(bindir):
            targets += sorted(os.path.join(bindir, f) for f in os.listdir(bindir) if f.endswith(".rs"))
        for t in targets:
            label = os.path.relpath(t, ROOT)
            bad, n = check_target(label, t)
            failed |= bad
            checked.append("%s (%d modules)" % (label, n))
    if failed:
        print("check-imports: import circles found (see above)")
        sys.exit(1)
    print("check-imports: no import circle in " + ", ".join(checked))


if __name__ == "__main__":
    main()
