#!/usr/bin/env python3
# Writes tests/golden/fixtures/regex/cases.json: regular expressions and strings labelled by Python's `re` (the
# syntax vLLM's guided_regex users write), with re.ASCII (lathe's \d \w \s are ASCII):
#   full   re.fullmatch(pattern, s): guided_regex, where the whole output is one match;
#   search re.search(pattern, s) with a final `$` read as `\Z` (ECMA-262's `$`, which JSON Schema's `pattern`
#          uses, does not match before a trailing newline as Python's does): a JSON schema string's `pattern`.
# Strings: random matches drawn by `rstr` (PyPI), single-character mutants of them, and short random strings over
# the pattern's alphabet. The C++ test (tests/golden/regex_test.cc) checks server::RegexToGbnf's grammar against
# both labels, the second on the string as json.dumps writes it inside a JSON document.
#
#   $PY tools/ref/make_regex_fixture.py        (needs rstr from PyPI; seconds)
import importlib.metadata
import json
import os
import random
import re

import rstr
import importlib
xeger_module = importlib.import_module("rstr.xeger")

# Matches stay short: Python's backtracking takes exponential time on strings like "aaaa...x" against (a*)*b.
xeger_module.STAR_PLUS_LIMIT = 6

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests/golden/fixtures/regex/cases.json")

PATTERNS = [
    r"[A-Z]{2}-\d{3}",
    r"(cat|dog)s?",
    r"a(b|cd)*e+",
    r"\w+@\w+\.(com|org)",
    r"-?(0|[1-9]\d*)(\.\d+)?",
    r"[^aeiou\s]{1,4}x?",
    r"(?:ab){2,3}|c{,2}",
    r"(?P<y>\d{4})-(?P<m>\d\d)",
    r"\(\d{3}\) \d{3}-\d{4}",
    "[\u00e9\u20ac-\u20ae]+z\u00df?",
    r"(a*)*b",
    r"(a|b?)+c",
    r"(x?y?)*z",
    r".{2}\.",
    r"[a-c-]+",
    r"[]a]+!",
    r"x{3,}",
    r"(?#a comment)ab*?c+?",
    r"^\d+$",
    r"ab|^cd|ef$",
    r"\x41\u0042\n\t?",
    r"[\d\s]+",
    r"(a|)b",
    r"\"[^\"\\]*\"",
    r"[\\\"]{2}\\d",
    r"\W\S\D",
    r"[^\x00-\x1f\"]{0,3}q",
    r"a{0}b",
    r"\{x\}|x{,}",
    r"[\^\]\[]+",
]

EXTRA_CHARS = list("aAz09 -_.\n\t\"\\\u00e9\u20ac\x01{}")


def alphabet(pattern):
    chars = set(EXTRA_CHARS)
    for c in pattern:
        if c.isprintable() and c != "\x7f":
            chars.add(c)
    return sorted(chars)


def search_pattern(p):
    return p[:-1] + r"\Z" if p.endswith("$") and not p.endswith(r"\$") else p


def main():
    rng = random.Random(20261207)
    rs = rstr.Rstr(rng)
    cases = []
    for p in PATTERNS:
        full = re.compile(p, re.ASCII)
        search = re.compile(search_pattern(p), re.ASCII)
        chars = alphabet(p)
        strings = set()
        for _ in range(40):
            try:
                m = rs.xeger(p)
            except Exception:  # noqa: BLE001 - rstr does not know every construct
                break
            if "\x7f" in m or len(m) > 20:
                continue
            strings.add(m)
            for _ in range(3):
                i = rng.randrange(len(m) + 1)
                op = rng.randrange(3)
                if op == 0 and i < len(m):
                    strings.add(m[:i] + m[i + 1:])
                elif op == 1:
                    strings.add(m[:i] + rng.choice(chars) + m[i:])
                elif i < len(m):
                    strings.add(m[:i] + rng.choice(chars) + m[i + 1:])
        for _ in range(150):
            strings.add("".join(rng.choice(chars) for _ in range(rng.randrange(7))))
        rows = sorted([s, full.fullmatch(s) is not None, search.search(s) is not None] for s in strings)
        assert any(r[1] for r in rows) and any(not r[1] for r in rows), p
        cases.append({"pattern": p, "strings": rows})
    about = ("Made by tools/ref/make_regex_fixture.py with Python %s's re (re.ASCII) and rstr %s: each row is [string, "
             "re.fullmatch, re.search with a final $ as \\Z]." % (
                 ".".join(map(str, __import__("sys").version_info[:3])), importlib.metadata.version("rstr")))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"about": about, "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("wrote %s: %d patterns, %d strings (%d full matches)" % (
        OUT, len(cases), sum(len(c["strings"]) for c in cases), sum(r[1] for c in cases for r in c["strings"])))


if __name__ == "__main__":
    main()
