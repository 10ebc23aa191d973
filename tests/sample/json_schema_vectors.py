#!/usr/bin/python3
"""Generates vectors/json_schema_vectors.json for json_schema_test.cpp.

For a fixed list of schemas (every keyword the compiler supports), and with a fixed seed, many
candidate instances as JSON text: values drawn from the schema in the grammar's canonical form
(compact, properties in schema order), then near misses (wrong types, out of range, missing or
extra properties, strings that miss the pattern or the format, reordered keys), whitespace
variants and mutated or broken text. Each is marked with whether it parses as JSON, whether
Python's jsonschema (Draft 2020-12, with format checking) finds it valid, and whether it is in
canonical form. The C++ test checks: accepted => valid, and canonical and valid => accepted.

Formats are checked by strict checkers written here from the RFCs, since jsonschema's own are
missing (date-time, time, hostname, duration without their optional packages) or loose (email:
any '@'). uri uses rfc3987 (Debian: python3-rfc3987) when it is installed.

Also, when given a file of random sentences of each schema's grammar (written by the disabled
test JsonSchemaVectors.DISABLED_WriteGrammarSamples), those sentences are labelled and added: texts
the grammar writes by construction, which all must be valid.

Run: /usr/bin/python3 tests/sample/json_schema_vectors.py [SAMPLES.json]   (rewrites the vectors)
  OFFGRAPH_GRAMMAR_SAMPLES=/tmp/samples.json build/bin/sample_tests \
    --gtest_also_run_disabled_tests --gtest_filter='*WriteGrammarSamples'
"""

import copy
import datetime
import ipaddress
import json
import os
import random
import re
import uuid

from jsonschema import Draft202012Validator, FormatChecker

SEED = 20240611
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "vectors", "json_schema_vectors.json")

# ---- strict format checkers ----

checker = FormatChecker()


def _date(s):
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", s)
    if not m:
        return False
    try:
        datetime.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return False
    return True


def _time(s):
    m = re.fullmatch(r"(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-](\d{2}):(\d{2}))", s)
    if not m:
        return False
    if int(m[1]) > 23 or int(m[2]) > 59 or int(m[3]) > 59:
        return False
    if m[6] is not None and (int(m[6]) > 23 or int(m[7]) > 59):
        return False
    return True


def _ldh_name(s, max_total):
    if len(s) > max_total or s.endswith("."):
        return False
    labels = s.split(".")
    for label in labels:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", label):
            return False
    return not labels[-1].isdigit()


@checker.checks("date")
def check_date(s):
    return not isinstance(s, str) or _date(s)


@checker.checks("time")
def check_time(s):
    return not isinstance(s, str) or _time(s)


@checker.checks("date-time")
def check_date_time(s):
    if not isinstance(s, str):
        return True
    if len(s) < 11 or s[10] not in "Tt":
        return False
    return _date(s[:10]) and _time(s[11:])


@checker.checks("hostname")
def check_hostname(s):
    return not isinstance(s, str) or _ldh_name(s, 253)


@checker.checks("email")
def check_email(s):
    # RFC 5321 Mailbox with a Dot-string local part and a domain name, within its length limits.
    if not isinstance(s, str):
        return True
    if s.count("@") != 1 or len(s) > 254:
        return False
    local, domain = s.split("@")
    atext = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
    if len(local) > 64 or not re.fullmatch(atext + r"(\." + atext + r")*", local):
        return False
    return _ldh_name(domain, 255)


@checker.checks("duration")
def check_duration(s):
    # RFC 3339 appendix A, by hand: P (date [time] | time | week).
    if not isinstance(s, str) or not s.startswith("P"):
        return False if isinstance(s, str) else True
    rest = s[1:]

    def units(text, order):
        # Consecutive units from `order`, each at most once, no gaps; all of text consumed.
        parts = re.findall(r"(\d+)([A-Z])", text)
        if "".join(n + u for n, u in parts) != text or not parts:
            return False
        letters = "".join(u for _, u in parts)
        return letters in [order[i:j] for i in range(len(order)) for j in range(i + 1, len(order) + 1)]

    if re.fullmatch(r"\d+W", rest):
        return True
    date_part, _, time_part = rest.partition("T")
    if "T" in rest and not time_part:
        return False
    if date_part and not units(date_part, "YMD"):
        return False
    if time_part and not units(time_part, "HMS"):
        return False
    return bool(date_part or time_part)


@checker.checks("uuid", raises=ValueError)
def check_uuid(s):
    if not isinstance(s, str):
        return True
    uuid.UUID(s)
    return len(s) == 36 and all(s[i] == "-" for i in (8, 13, 18, 23))


@checker.checks("ipv4")
def check_ipv4(s):
    if not isinstance(s, str):
        return True
    try:
        ipaddress.IPv4Address(s)
        return True
    except ValueError:
        return False


@checker.checks("ipv6")
def check_ipv6(s):
    if not isinstance(s, str):
        return True
    try:
        return not getattr(ipaddress.IPv6Address(s), "scope_id", None)
    except ValueError:
        return False


try:
    import rfc3987

    @checker.checks("uri")
    def check_uri(s):
        return not isinstance(s, str) or rfc3987.match(s, rule="URI") is not None

    HAVE_URI = True
except ImportError:
    HAVE_URI = False


# ---- samples of formatted strings: in the grammar's subset, valid outside it, invalid ----

FORMATS = {
    "date": (["2024-02-29", "2023-12-31", "0001-01-01", "2000-02-29", "1999-06-30", "2024-10-05"],
             [],
             ["2023-02-29", "1900-02-29", "2024-13-01", "2024-04-31", "0000-01-01", "2024-1-01",
              "20240101", "2024-02-30", "2024-00-10", " 2024-01-01"]),
    "time": (["00:00:00Z", "23:59:59+05:30", "12:30:00.123Z", "08:15:00-08:00"],
             ["12:00:00z"],
             ["24:00:00Z", "12:60:00Z", "12:00:60Z", "12:00:00", "12:00Z", "12:00:00+24:00",
              "1:00:00Z", "12:00:00.Z"]),
    "date-time": (["2024-02-29T12:00:00Z", "1985-04-12T23:20:50.52Z", "1996-12-19T16:39:57-08:00"],
                  ["2024-01-01t00:00:00z"],
                  ["2023-02-29T12:00:00Z", "2024-01-01 12:00:00Z", "2024-01-01T25:00:00Z",
                   "2024-01-01T12:00:00", "2024-01-01", "2024-01-01T12:00:00+0100"]),
    "duration": (["P1Y", "P1Y2M3DT4H5M6S", "PT1H", "P3W", "PT10M30S", "P2D", "P1M2D", "PT5S"],
                 [],
                 ["P", "PT", "P1H", "1Y", "P1S", "PT1D", "P1Y3D", "P1W2D", "P-1Y", "P1.5Y"]),
    "uuid": (["123e4567-e89b-12d3-a456-426614174000", "00000000-0000-0000-0000-000000000000",
              "ABCDEF01-2345-6789-ABCD-EF0123456789"],
             [],
             ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400",
              "g23e4567-e89b-12d3-a456-426614174000", "{123e4567-e89b-12d3-a456-426614174000}"]),
    "ipv4": (["192.168.0.1", "0.0.0.0", "255.255.255.255", "10.0.0.254"],
             [],
             ["256.0.0.1", "1.2.3", "01.2.3.4", "1.2.3.4.5", "1.2.3.-4", "a.b.c.d"]),
    "ipv6": (["::1", "::", "2001:db8::8a2e:370:7334", "fe80::1:2:3:4", "::ffff:192.168.0.1",
              "1:2:3:4:5:6:7:8", "1::8", "1:2:3:4:5:6:7::"],
             [],
             ["1:2:3:4:5:6:7:8:9", "12345::", "1::2::3", ":1:2", "g::1", "fe80::1%eth0",
              "1:2:3:4:5:6:7", "::ffff:256.1.1.1"]),
    "hostname": (["example.com", "a.b.c.example.org", "xn--bcher-kva.example", "my-host.io"],
                 ["localhost", "a" * 40 + ".com"],
                 ["-bad.com", "bad-.com", "a..b", "under_score.com", "exa mple.com", "a.b.",
                  "b" * 64 + ".com", "1.2.3.4"]),
    "email": (["user@example.com", "first.last@mail.example.org", "a+b@x.io",
               "o'brien@example.ie"],
              ["user@localhost"],
              ["userexample.com", "user@@example.com", ".user@example.com", "user.@example.com",
               "us..er@example.com", "user@-example.com", "user name@example.com", "@example.com",
               "user@"]),
    "uri": (["https://example.com/path?q=1#frag", "mailto:user@example.com", "urn:isbn:0451450523",
             "http://[::1]:8080/", "ftp://user:pw@host/file.txt", "file:///etc/passwd",
             "http://example.com/%20space"],
            [],
            ["example.com", "http://exa mple.com", "://no-scheme", "http://example.com/%zz",
             "1http://x", "http://[::1/"]),
}

# ---- patterns: strings matching and not (including ones only some regex engines match) ----

PATTERNS = {
    "^[a-z][a-z0-9_]{2,15}$": ["abc", "user_1", "a1", "Abc", "abc-d", "a" * 16, "a" * 17, "ab"],
    "^\\d{3}-\\d{4}$": ["555-1234", "5551234", "555-12345", "55-1234", "a55-1234",
                        "\u0665\u0665\u0665-1234"],
    "[0-9]+": ["abc123def", "1", "abc", "", "x9", "\n5\n"],
    "^(foo|bar)+baz?$": ["foobaz", "barfooba", "baz", "foofoo", "foobar", "fooba", "barbazz"],
    "^\\w+@\\w+\\.com$": ["me@site.com", "me@site.org", "@site.com", "m.e@site.com", "\u00e9@a.com"],
    "^[^\\s\"]{1,8}$": ["abc", "a b", "a\"b", "", "\u00e9\u00e8", "123456789", "\u2028", "tab\there"],
    "colou?r": ["color", "the colour red", "colr", "COLOR", "xcolourx"],
    "^\\S+$": ["x", "two words", "\u00a0", "\ufeff", "\u0085", "ok!"],
    "^.{2}$": ["ab", "a\nb"[0:2], "\r\n", "\U0001F600\U0001F600", "\u00e9\u00e8", "a"],
    "^[A-F0-9]{2}(?::[A-F0-9]{2}){5}$": ["00:1A:2B:3C:4D:5E", "00:1a:2b:3c:4d:5e", "00:1A:2B:3C:4D",
                                         "001A2B3C4D5E"],
    "^\\x41\\u0042[\\x43-\\x45]*$": ["AB", "ABC", "ABCDE", "ABF", "ab"],
    "^(?:a|b)*?c+?$": ["c", "abc", "ababcc", "ab", "cab"],
    "^\\D\\W\\s$": ["a! ", "1! ", "a1 ", "a!x", "\u00e9! ", "a!\u00a0"],
    "^[\\w.-]+$": ["a.b-c_d", "a b", "-", "\u00fc"],
    "^$": ["", "a"],
    "x$": ["ax", "x", "xa", "x\n"],
    "^a|b$": ["ac", "cb", "ca", "ab", "bc"],
    "^[+-]?[0-9]+(\\.[0-9]+)?$": ["1", "-1.5", "+0.25", "1.", ".5", "--1"],
    "^\\\\[\"\\/]$": ["\\\"", "\\/", "\\x", "\""],
    "^[\\]\\[]{2}$": ["[]", "][", "[[", "a]"],
}

# ---- the schemas ----

TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3},
            },
            "required": ["value", "children"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}

LINKED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 5},
        "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
    },
    "required": ["name", "next"],
    "additionalProperties": False,
}

PERSON = {
    "title": "Person",
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["name", "age"],
}

SCHEMAS = [
    ("true", True, False),
    ("empty", {}, False),
    ("null", {"type": "null"}, False),
    ("boolean", {"type": "boolean"}, False),
    ("integer", {"type": "integer"}, False),
    ("number", {"type": "number"}, False),
    ("string", {"type": "string"}, False),
    ("object_any", {"type": "object"}, False),
    ("array_any", {"type": "array"}, False),
    ("type_list", {"type": ["string", "null", "integer"]}, False),
    ("int_range", {"type": "integer", "minimum": -17, "maximum": 1234}, False),
    ("int_excl", {"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 101}, False),
    ("int_neg", {"type": "integer", "minimum": -5000, "maximum": -99}, False),
    ("int_min_only", {"type": "integer", "minimum": 42}, False),
    ("int_max_only", {"type": "integer", "maximum": -3}, False),
    ("int_frac_bounds", {"type": "integer", "minimum": 1.5, "exclusiveMaximum": 7.5}, False),
    ("int_multiple", {"type": "integer", "multipleOf": 7}, False),
    ("int_big", {"type": "integer", "minimum": 999999999999, "maximum": 1000000000123}, False),
    ("num_range", {"type": "number", "minimum": -2, "maximum": 3}, False),
    ("num_excl", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, False),
    ("num_excl_neg", {"type": "number", "exclusiveMinimum": -10, "exclusiveMaximum": -1}, False),
    ("num_min", {"type": "number", "minimum": 100}, False),
    ("num_max", {"type": "number", "exclusiveMaximum": -100}, False),
    ("num_multiple", {"type": "number", "multipleOf": 5}, False),
    ("str_len", {"type": "string", "minLength": 2, "maxLength": 5}, False),
    ("str_min", {"type": "string", "minLength": 3}, False),
    ("enum_mixed", {"enum": ["red", 1, 2.5, None, True, {"a": [1, "x"]}, [1, 2], "quote\"d",
                             "line\nbreak", "\u00e9t\u00e9"]}, False),
    ("enum_typed", {"type": "string", "enum": ["a", "b", 3]}, False),
    ("enum_filtered", {"type": "string", "maxLength": 3, "enum": ["ab", "abcd", "xyz", 12]}, False),
    ("const_obj", {"const": {"k": "v", "n": [1, 2]}}, False),
    ("const_str", {"type": "string", "const": "fixed"}, False),
    ("any_of", {"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string", "maxLength": 2},
                          {"type": "null"}]}, False),
    ("all_of_one", {"allOf": [{"type": "boolean"}], "description": "wrapped"}, False),
    ("person", PERSON, False),
    ("strict_person", {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": ["integer", "null"]},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "age", "address"],
        "additionalProperties": False,
    }, True),
    ("optional_props", {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"type": "null"},
                       "d": {"type": "string", "maxLength": 2}},
        "required": ["c"],
        "additionalProperties": False,
    }, False),
    ("all_optional", {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    }, False),
    ("extra_schema", {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "required": ["id"],
        "additionalProperties": {"type": "string", "maxLength": 3},
    }, False),
    ("map", {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}, False),
    ("required_only", {"type": "object", "required": ["must"]}, False),
    ("false_prop", {"type": "object", "properties": {"a": {"type": "integer"}, "gone": False}}, False),
    ("nested_enum", {
        "type": "object",
        "properties": {
            "order": {
                "type": "object",
                "properties": {
                    "status": {"enum": ["new", "paid", "shipped"]},
                    "items": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                                           "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                            "required": ["sku", "qty"],
                            "additionalProperties": False,
                        },
                    },
                },
                "required": ["status", "items"],
                "additionalProperties": False,
            }
        },
        "required": ["order"],
        "additionalProperties": False,
    }, False),
    ("array_bounds", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}, False),
    ("array_exact", {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 3}, False),
    ("tuple_open", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]}, False),
    ("tuple_closed", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                      "items": False, "minItems": 1}, False),
    ("tuple_rest", {"type": "array", "prefixItems": [{"type": "null"}], "items": {"type": "boolean"},
                    "maxItems": 3}, False),
    ("unique_one", {"type": "array", "uniqueItems": True, "maxItems": 1}, False),
    ("tree", TREE, False),
    ("linked", LINKED, True),
    ("defs_legacy", {"definitions": {"a~b/c": {"type": "integer", "maximum": 5}},
                     "type": "array", "items": {"$ref": "#/definitions/a~0b~1c"}}, False),
    ("ref_pointer", {"type": "object", "properties": {"p": {"type": "string", "maxLength": 1},
                                                       "q": {"$ref": "#/properties/p"}},
                     "additionalProperties": False}, False),
    ("escaped_keys", {"type": "object", "properties": {"a\"b": {"type": "integer"}, "c\\d": {"type": "null"},
                                                        "\u00fc": {"type": "boolean"}},
                      "required": ["a\"b"]}, False),
    ("enum_pattern", {"type": "string", "pattern": "^a", "enum": ["ab", "ba", "abc", 1]}, False),
    ("enum_bounds", {"type": "number", "minimum": 0, "exclusiveMaximum": 10,
                     "enum": [-1, 0, 5.5, 10, 9.99, "x", 3]}, False),
    ("many_optional", {"type": "object",
                       "properties": {"p%d" % i: {"type": "integer", "maximum": i} for i in range(30)},
                       "required": ["p7", "p20"]}, False),
    ("prefix_keys", {"type": "object",
                     "properties": {"a": {"type": "integer"}, "ab": {"type": "null"},
                                    "abc": {"type": "boolean"}, "b": {"type": "string", "maxLength": 1}},
                     "additionalProperties": {"type": "null"}}, False),
    ("anyof_refs", {"$defs": {"s": {"type": "string", "format": "uuid"},
                              "n": {"type": "integer", "exclusiveMinimum": -3, "maximum": 3},
                              "either": {"anyOf": [{"$ref": "#/$defs/s"}, {"$ref": "#/$defs/n"},
                                                   {"type": "array", "items": {"$ref": "#/$defs/either"},
                                                    "maxItems": 2}]}},
                    "$ref": "#/$defs/either"}, False),
    ("strict_arrays", {"type": "object",
                       "properties": {"rows": {"type": "array", "items": {
                           "type": "object",
                           "properties": {"k": {"type": "string", "enum": ["x", "y"]},
                                          "v": {"anyOf": [{"type": "number"}, {"type": "null"}]}},
                           "required": ["k", "v"], "additionalProperties": False}}},
                       "required": ["rows"], "additionalProperties": False}, True),
    ("untyped_keywords", {"minimum": 5, "maxLength": 2, "properties": {"a": {"type": "null"}},
                          "required": ["a"], "items": {"type": "integer"}}, False),
]
for fmt in FORMATS:
    if fmt != "uri" or HAVE_URI:
        SCHEMAS.append(("format_" + fmt, {"type": "string", "format": fmt}, False))
for i, p in enumerate(PATTERNS):
    SCHEMAS.append(("pattern_%d" % i, {"type": "string", "pattern": p}, False))
SCHEMAS.append(("pattern_len", {"type": "string", "pattern": "^[a-c]+$", "minLength": 2, "maxLength": 4}, False))
SCHEMAS.append(("format_len", {"type": "string", "format": "date", "maxLength": 10}, False))

# ---- instance generation ----

UNICODE = "a\u00e9\u4e2d\U0001F600\"\\/\n\t\u0001\u007f \u2028"


def resolve(root, ref):
    node = root
    if ref == "#":
        return root
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def random_scalar(rng):
    return rng.choice([None, True, False, 0, -7, 3.25, "", "s", "x\"y", rng.randint(-1000, 1000)])


def random_any(rng, d):
    if d > 2:
        return random_scalar(rng)
    kind = rng.randrange(4)
    if kind == 0:
        return [random_any(rng, d + 1) for _ in range(rng.randrange(3))]
    if kind == 1:
        return {rng.choice(["k", "a b", "\u00e9", "q\"", "n%d" % i]): random_any(rng, d + 1)
                for i in range(rng.randrange(3))}
    return random_scalar(rng)


def random_string(rng, lo, hi):
    n = rng.randint(lo, hi)
    return "".join(rng.choice(UNICODE) for _ in range(n))


def int_bounds(s):
    import math
    lo, hi = None, None
    if "minimum" in s:
        lo = math.ceil(s["minimum"])
    if "exclusiveMinimum" in s:
        v = math.floor(s["exclusiveMinimum"]) + 1
        lo = v if lo is None else max(lo, v)
    if "maximum" in s:
        hi = math.floor(s["maximum"])
    if "exclusiveMaximum" in s:
        v = math.ceil(s["exclusiveMaximum"]) - 1
        hi = v if hi is None else min(hi, v)
    return lo, hi


def gen_int(rng, s):
    lo, hi = int_bounds(s)
    if lo is None and hi is None:
        v = rng.choice([0, 1, -1, rng.randint(-10**6, 10**6), 10**20 + 7])
    elif lo is None:
        v = hi - rng.choice([0, 1, 7, 1000])
    elif hi is None:
        v = lo + rng.choice([0, 1, 9, 12345])
    else:
        v = rng.choice([lo, hi, rng.randint(lo, hi)])
    if "multipleOf" in s:
        v = int(v % 10**14 // s["multipleOf"] * s["multipleOf"])
    return v


def gen_num(rng, s):
    if "multipleOf" in s:
        return gen_int(rng, s)
    lo = s.get("minimum", s.get("exclusiveMinimum"))
    hi = s.get("maximum", s.get("exclusiveMaximum"))
    if lo is None and hi is None:
        return rng.choice([0, 1.5, -2.25, 3, 123456.75, -0.001])
    a = lo if lo is not None else hi - 50
    b = hi if hi is not None else lo + 50
    for _ in range(100):
        v = rng.choice([round(rng.uniform(a, b), 2), rng.randint(int(a), int(b)), a, b])
        v = v + 0.0 if isinstance(v, float) else v
        if Draft202012Validator(s).is_valid(v):
            return v
    return a


def gen_str(rng, s, samples):
    if "format" in s:
        return rng.choice(FORMATS[s["format"]][0])
    if "pattern" in s:
        good = [x for x in PATTERNS.get(s["pattern"], []) if re.search(s["pattern"], x)
                and all(" " <= c <= "~" for c in x) and Draft202012Validator(s).is_valid(x)]
        if s["pattern"] == "^[a-c]+$":
            good = ["ab", "abc", "cccc", "ba"]
        return rng.choice(good) if good else "zz"
    lo = s.get("minLength", 0)
    hi = s.get("maxLength", lo + 6)
    return random_string(rng, lo, hi)


def gen(rng, s, root, d=0):
    """A value valid for `s`, in the grammar's canonical form (properties in schema order)."""
    if s is True or s == {}:
        return random_any(rng, d)
    if "$ref" in s:
        return gen(rng, resolve(root, s["$ref"]), root, d + 1)
    if "anyOf" in s:
        branches = s["anyOf"]
        if d > 4:
            branches = [b for b in branches if "$ref" not in b] or branches
        return gen(rng, rng.choice(branches), root, d + 1)
    if "allOf" in s:
        return gen(rng, s["allOf"][0], root, d + 1)
    if "const" in s:
        return copy.deepcopy(s["const"])
    if "enum" in s:
        for _ in range(50):
            v = copy.deepcopy(rng.choice(s["enum"]))
            if Draft202012Validator(s).is_valid(v):
                return v
    t = s.get("type")
    if isinstance(t, list):
        t = rng.choice(t)
    if t is None:
        t = rng.choice(["object", "array", "string", "integer", "null", "boolean"])
    if t == "null":
        return None
    if t == "boolean":
        return rng.random() < 0.5
    if t == "integer":
        return gen_int(rng, s)
    if t == "number":
        return gen_num(rng, s)
    if t == "string":
        return gen_str(rng, s, None)
    if t == "array":
        prefix = s.get("prefixItems", [])
        lo = s.get("minItems", 0)
        hi = s.get("maxItems", max(lo, len(prefix)) + 3)
        if s.get("items") is False:
            hi = min(hi, len(prefix))
        n = lo if d > 3 else rng.randint(lo, hi)
        out = []
        for i in range(n):
            sub = prefix[i] if i < len(prefix) else s.get("items", True)
            out.append(gen(rng, sub, root, d + 1))
        return out
    # object
    props = s.get("properties", {})
    required = s.get("required", [])
    out = {}
    for k, sub in props.items():
        if sub is False:
            continue
        if k in required or (d < 4 and rng.random() < 0.6):
            out[k] = gen(rng, sub, root, d + 1)
    extra = s.get("additionalProperties")
    for k in required:
        if k not in props:
            out[k] = gen(rng, extra if isinstance(extra, dict) else True, root, d + 1)
    if isinstance(extra, dict) or (extra is not False and not props):
        for i in range(rng.randrange(3)):
            k = rng.choice(["x%d" % i, "extra", "\u00e9%d" % i])
            if k not in props and k not in required and k not in out:
                out[k] = gen(rng, extra if isinstance(extra, dict) else True, root, d + 1)
    return out


def compact(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def mutate_value(rng, v, s, root):
    """A near miss: one change somewhere inside the value."""
    v = copy.deepcopy(v)
    paths = []

    def walk(x, path):
        paths.append(path)
        if isinstance(x, dict):
            for k in x:
                walk(x[k], path + [k])
        elif isinstance(x, list):
            for i, e in enumerate(x):
                walk(e, path + [i])

    walk(v, [])
    path = rng.choice(paths)
    parent = None
    node = v
    for p in path:
        parent, node = node, node[p]

    def replace(new):
        nonlocal v
        if parent is None:
            v = new
        else:
            parent[path[-1]] = new

    r = rng.randrange(8)
    if r == 0:
        replace(random_scalar(rng))
    elif r == 1 and isinstance(node, dict) and node:
        del node[rng.choice(list(node))]
    elif r == 2 and isinstance(node, dict):
        node[rng.choice(["zz", "extra", "name"])] = random_scalar(rng)
    elif r == 3 and isinstance(node, dict) and len(node) > 1:
        items = list(node.items())
        rng.shuffle(items)
        replace(dict(items))
    elif r == 4 and isinstance(node, (int, float)) and not isinstance(node, bool):
        replace(node + rng.choice([1, -1, 0.5, -0.5, 1000, -1000]))
    elif r == 5 and isinstance(node, str):
        replace(node + rng.choice(["a", "0", "-", " ", "\u00e9", "Z"]) if rng.random() < 0.5 else node[1:])
    elif r == 6 and isinstance(node, list):
        if node and rng.random() < 0.5:
            node.pop()
        else:
            node.append(copy.deepcopy(node[0]) if node else random_scalar(rng))
    else:
        replace([node] if rng.random() < 0.5 else str(node))
    return v


def mutate_text(rng, text):
    ops = rng.randrange(6)
    if not text:
        return " "
    i = rng.randrange(len(text))
    if ops == 0:
        return text[:i] + text[i + 1:]
    if ops == 1:
        return text[:i] + rng.choice('{}[],:"0-. \\ae') + text[i:]
    if ops == 2:
        return text[:i]
    if ops == 3:
        return text + rng.choice(["", ",", "}", " ", "\n", "0"])
    if ops == 4:
        return text[:i] + text[i:i + 3] + text[i:]
    return text.replace(",", ", ", 1).replace(":", ": ", 1)


def whitespace_variants(v):
    out = [json.dumps(v, ensure_ascii=False), json.dumps(v, indent=2, ensure_ascii=False),
           json.dumps(v, separators=(",", ":"), ensure_ascii=True), " " + compact(v),
           compact(v) + "\n", json.dumps(v, indent="\t", ensure_ascii=False)]
    return out


def strict_json(text):
    def bad_constant(name):
        raise ValueError(name)

    return json.loads(text, parse_constant=bad_constant)


def verdict(validator, text):
    try:
        value = strict_json(text)
    except (ValueError, RecursionError):
        return False, False
    return True, validator.is_valid(value)


def string_candidates(s):
    """Strings for a string schema beyond the generator's: the sample pools, valid or not."""
    out = []
    if "format" in s:
        good, other, bad = FORMATS[s["format"]]
        out += [(x, True) for x in good] + [(x, False) for x in other + bad]
    if "pattern" in s:
        out += [(x, False) for x in PATTERNS.get(s["pattern"], [])]
    return out


def cases(grammar_samples):
    rng = random.Random(SEED)
    result = []
    for name, schema, strict in SCHEMAS:
        Draft202012Validator.check_schema(schema)
        validator = Draft202012Validator(schema, format_checker=checker)
        seen = {}

        def add(text, canonical):
            if text in seen:
                seen[text]["canonical"] |= canonical
                return
            ok, valid = verdict(validator, text)
            seen[text] = {"text": text, "json": ok, "valid": valid, "canonical": canonical}

        values = []
        for _ in range(25):
            v = gen(rng, schema, schema)
            values.append(v)
            add(compact(v), True)
        if isinstance(schema, dict) and schema.get("type") == "string":
            for x, in_subset in string_candidates(schema):
                # A pattern's pool strings are canonical where the grammar's sets are exact:
                # printable ASCII (engines differ beyond it).
                canonical = in_subset or ("pattern" in schema and all(" " <= c <= "~" for c in x))
                add(compact(x), canonical)
        for v in values[:12]:
            for _ in range(3):
                add(compact(mutate_value(rng, v, schema, schema)), False)
        for v in values[:4]:
            for t in whitespace_variants(v):
                add(t, False)
        for v in values[:10]:
            for _ in range(2):
                add(mutate_text(rng, compact(v)), False)
        for t in ["", "null", "0", "-0", "1.0", "1e2", "\"\"", "{}", "[]", "true", "NaN",
                  "01", "1.", ".5", "-", "\"\\ud800\"", "[1,]", "{\"a\":1,}", "\"\\u00e9\"",
                  "{\"a\":1,\"a\":1}", "Infinity", "\"\t\"", "[[[[[]]]]]"]:
            add(t, False)
        for t in grammar_samples.get(name, []):
            add(t, False)
            if not seen[t]["valid"]:
                print("UNSOUND: %s accepts %r" % (name, t))
        result.append({"name": name, "schema": schema, "strict": strict,
                       "instances": list(seen.values())})
    return result


def main():
    import sys
    samples = {}
    if len(sys.argv) > 1:
        with open(sys.argv[1], encoding="utf-8") as f:
            samples = json.load(f)
    doc = {"generator": "tests/sample/json_schema_vectors.py", "seed": SEED,
           "jsonschema": __import__("importlib.metadata").metadata.version("jsonschema"),
           "cases": cases(samples)}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    def dumps(v):
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))

    # One instance a line, so that a change to the vectors reads as a diff.
    with open(OUT, "w", encoding="utf-8") as f:
        f.write('{"generator":%s,"seed":%d,"jsonschema":%s,"cases":[\n'
                % (dumps(doc["generator"]), doc["seed"], dumps(doc["jsonschema"])))
        for i, case in enumerate(doc["cases"]):
            f.write('{"name":%s,"schema":%s,"strict":%s,"instances":[\n'
                    % (dumps(case["name"]), dumps(case["schema"]), dumps(case["strict"])))
            f.write(",\n".join(dumps(inst) for inst in case["instances"]))
            f.write("]}%s\n" % ("," if i + 1 < len(doc["cases"]) else ""))
        f.write("]}\n")
    n = sum(len(c["instances"]) for c in doc["cases"])
    valid = sum(i["valid"] for c in doc["cases"] for i in c["instances"])
    print("%d schemas, %d instances (%d valid), %d bytes" % (len(doc["cases"]), n, valid,
                                                            os.path.getsize(OUT)))


if __name__ == "__main__":
    main()
