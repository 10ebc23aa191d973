#!/usr/bin/env python3
"""Validates instances against JSON Schemas with python3-jsonschema (Draft 2020-12, formats
checked), the independent judge of the structured-output tests.

Usage: validate_json.py FILE, where FILE holds [{"schema": ..., "text": "..."}]; prints a JSON list
with, per case, "" when the text parses as JSON and validates, else what is wrong.
"""
import json
import sys

import jsonschema

cases = json.load(open(sys.argv[1]))
out = []
for case in cases:
    try:
        instance = json.loads(case["text"])
    except ValueError as e:
        out.append("not JSON: %s" % e)
        continue
    validator = jsonschema.Draft202012Validator(
        case["schema"], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
    out.append("; ".join("%s at %s" % (e.message, list(e.path)) for e in errors))
print(json.dumps(out))
