#!/usr/bin/python3
"""Writes vectors/lark_vectors.json: Lark grammars and strings, each with whether Lark itself
(python3-lark, Earley with the dynamic_complete lexer: every way to cut the text into terminals,
which is the language the rules describe) takes it. lark_test.cpp checks parse_lark's grammar
against them. Strings are seeds written by hand and random edits of them (fixed seed), so that
most are near misses. Run: /usr/bin/python3 tests/sample/lark_vectors.py (Debian python3-lark)."""
import json
import os
import random

import lark

APPLY_PATCH = open(os.path.join(os.path.dirname(__file__), "apply_patch.lark")).read()

GRAMMARS = {
    "apply_patch": (APPLY_PATCH, [
        "*** Begin Patch\n*** Add File: hello.txt\n+Hello, World!\n*** End Patch",
        "*** Begin Patch\n*** Update File: src/main.py\n@@ def main():\n def main():\n"
        "-    print('old')\n+    print('new <b>')\n*** End Patch\n",
        "*** Begin Patch\n*** Update File: a.c\n*** Move to: b.c\n@@\n-x\n+y\n"
        "*** End of File\n*** Delete File: c.c\n*** End Patch\n",
        "*** Begin Patch\n*** Update File: e\n*** End Patch",
        # What '.' holds in Python's re: all but '\n' (CRLF lines, emoji, U+2028).
        "*** Begin Patch\n*** Add File: \u00e9t\u00e9.txt\n+caf\u00e9 \U0001F600\r\n+a\u2028b\n*** End Patch",
    ]),
    "json_like": (r"""
?start: value
?value: object | array | string | SIGNED_NUMBER -> number | "true" | "false" | "null"
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: string ":" value
string: ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
""", ['{"a": [1, -2.5e3, true], "b": {"c": null}}', '[]', ' [ "x" , {} ] ', '"\\"q\\""']),
    "constructs": (r"""
start: item+
item: "a".."c" | "x"i "y" | NUM ~ 2..3 ";" | [ "o" ] "p" | "q" ~ 2 | /z[0-9]{1,2}/ | CNAME "!" | /w[^x]/
NUM: "0".."9"
%import common.CNAME
""", ["abc", "Xyop", "12;123;", "qqz7z42", "ab_c9!p", "w\U0001F600w\u00e9"]),
    "lines": (r"""
start: line+
line: WORD (WS_INLINE WORD)* NEWLINE | SH_COMMENT NEWLINE | C_COMMENT NEWLINE
%import common (WORD, WS_INLINE, NEWLINE, SH_COMMENT, C_COMMENT)
""", ["hello world\n# note\n/* a * b */\n", "one\r\ntwo  three\n\n"]),
}


def edits(seed, rng, n):
    alphabet = sorted(set(seed) | set(" \n*+-@:.\"{}[],0123456789eE/abqxyzXY!;_#\t\\\r\u00e9\U0001F600\u2028"))
    out = []
    for _ in range(n):
        s = list(seed)
        for _ in range(rng.randint(1, 3)):
            op = rng.randint(0, 2)
            at = rng.randint(0, len(s))
            if op == 0 or not s:
                s.insert(at, rng.choice(alphabet))
            elif op == 1:
                del s[min(at, len(s) - 1)]
            else:
                s[min(at, len(s) - 1)] = rng.choice(alphabet)
        out.append("".join(s))
    return out


def main():
    rng = random.Random(20261205)
    vectors = []
    for name, (text, seeds) in GRAMMARS.items():
        # Dynamic Earley refuses a regex that can match nothing: /(.*)/ is written /(.+)/? for it,
        # the same language.
        parser = lark.Lark(text.replace("/(.*)/", "/(.+)/?"), parser="earley",
                           lexer="dynamic_complete")
        strings = list(seeds)
        for seed in seeds:
            strings += edits(seed, rng, 60)
        cases = []
        for s in dict.fromkeys(strings):
            try:
                parser.parse(s)
                ok = True
            except lark.exceptions.LarkError:
                ok = False
            cases.append({"text": s, "accepted": ok})
        vectors.append({"name": name, "grammar": text, "cases": cases})
    path = os.path.join(os.path.dirname(__file__), "vectors", "lark_vectors.json")
    with open(path, "w") as f:
        json.dump({"generator": "tests/sample/lark_vectors.py", "lark": lark.__version__,
                   "grammars": vectors}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
