#!/usr/bin/env python3
# Writes tests/golden/fixtures/json_schema/cases.json: JSON schemas, documents that the `jsonschema` package
# (the Python reference validator, Draft 2020-12) says are valid, and mutants of them it says are invalid (or that
# are not JSON at all, per Python's json module).
#
# The C++ test (tests/golden/json_schema_test.cc) compiles each schema with server::JsonSchemaToGbnf and checks
# that the grammar accepts every valid document and rejects every invalid one. Structured outputs generate
# members in the order `properties` lists them, with at most one space or a newline plus indentation between
# tokens, so the valid documents are written that way (json.dumps' default, indented and compact styles, ASCII
# escapes or raw UTF-8); the invalid side has no such restriction: whatever jsonschema rejects, the grammar must
# reject.
#
#   $PY tools/ref/make_json_schema_fixture.py   (needs jsonschema and rfc3339-validator from PyPI; seconds)
import importlib.metadata
import json
import os
import random

import jsonschema

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests/golden/fixtures/json_schema/cases.json")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "height": {"type": "number"},
        "admin": {"type": "boolean"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

CASES = [
    ("person", PERSON, [
        {"name": "Lily", "age": 3},
        {"name": "Tom", "age": 30, "email": "t@x.org", "height": 1.82, "admin": False},
        {"name": "Zo\u00eb \u20ac", "age": -7, "admin": True},
        {"name": "A", "age": 0, "height": -0.5e-3},
        {"name": "q\"b\\s", "age": 12, "email": "tab\tnl\n"},
    ]),
    ("enums_const_anyof", {
        "type": "object",
        "properties": {
            "kind": {"enum": ["cat", "dog", 3, None, True]},
            "version": {"const": "v1"},
            "value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}, {"type": "null"}]},
            "maybe": {"type": ["string", "null"]},
        },
        "required": ["kind", "version", "value"],
        "additionalProperties": False,
    }, [
        {"kind": "cat", "version": "v1", "value": 5},
        {"kind": 3, "version": "v1", "value": "abc", "maybe": None},
        {"kind": None, "version": "v1", "value": None, "maybe": "x"},
        {"kind": True, "version": "v1", "value": "", "maybe": ""},
    ]),
    ("arrays", {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
            "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}, "maxItems": 2}},
            "any": {"type": "array"},
            "none": {"type": "array", "maxItems": 0},
            "exactly2": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2},
        },
        "required": ["tags"],
        "additionalProperties": False,
    }, [
        {"tags": ["a"]},
        {"tags": ["a", "b", "c"], "matrix": [[1, 2], [], [3.5]], "any": [1, "x", None, {"k": [True]}]},
        {"tags": ["x"], "none": [], "exactly2": [True, False]},
        {"tags": ["\u00e9"], "matrix": []},
    ]),
    ("refs_recursive", {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["label"],
                "additionalProperties": False,
            },
        },
        "$ref": "#/$defs/node",
    }, [
        {"label": "root"},
        {"label": "a", "children": []},
        {"label": "a", "children": [{"label": "b"}, {"label": "c", "children": [{"label": "d"}]}]},
    ]),
    ("map_and_any", {
        "type": "object",
        "properties": {
            "scores": {"type": "object", "additionalProperties": {"type": "integer"}},
            "meta": {},
            "open": {"type": "object"},
        },
        "required": ["scores"],
        "additionalProperties": False,
    }, [
        {"scores": {}},
        {"scores": {"alice": 3, "bob": -1}, "meta": [1, {"x": None}], "open": {"k": "v", "n": [1.5]}},
        {"scores": {"": 0}, "meta": "text", "open": {}},
        {"scores": {"a": 1}, "meta": None},
    ]),
    ("top_level_array", {"type": "array", "items": {"type": "integer"}, "maxItems": 4}, [
        [], [1], [1, 2, 3, 4],
    ]),
    ("integer_bounds", {
        "type": "object",
        "properties": {
            "percent": {"type": "integer", "minimum": 0, "maximum": 100},
            "delta": {"type": "integer", "exclusiveMinimum": -50, "exclusiveMaximum": 1000},
            "floor": {"type": "integer", "minimum": 17},
            "neg": {"type": ["integer", "null"], "maximum": -3},
        },
        "required": ["percent"],
        "additionalProperties": False,
    }, [
        {"percent": 0}, {"percent": 100, "delta": -49}, {"percent": 42, "delta": 999, "floor": 17},
        {"percent": 7, "floor": 123456, "neg": -3}, {"percent": 99, "delta": 0, "neg": None},
        {"percent": 10, "neg": -1000},
    ]),
    ("number_bounds", {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "temp": {"type": "number", "exclusiveMinimum": -273.15},
            "price": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 999.99},
            "neg": {"type": "number", "exclusiveMaximum": -0.5},
        },
        "required": ["ratio"],
        "additionalProperties": False,
    }, [
        {"ratio": 0}, {"ratio": 1, "lat": -90}, {"ratio": 0.25, "lat": 45.5, "temp": -273.14},
        {"ratio": 0.999, "price": 999.99, "neg": -0.51}, {"ratio": 0.5, "temp": 21.5, "price": 0.01, "neg": -7},
        {"ratio": 1.0, "lat": 89.999, "price": None},
    ]),
    ("patterns_and_formats", {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
            "word": {"type": "string", "pattern": "colou?r"},
            "quoted": {"type": "string", "pattern": "^\"[^\"\\\\]*\"$"},
            "day": {"type": "string", "format": "date"},
            "when": {"type": "string", "format": "date-time"},
            "id": {"type": "string", "format": "uuid"},
            "ip": {"type": "string", "format": "ipv4"},
            "mail": {"type": "string", "format": "email"},
        },
        "required": ["code"],
        "additionalProperties": False,
    }, [
        {"code": "AB-123"},
        {"code": "ZZ-000", "word": "the color red", "quoted": "\"hi there\"", "day": "2026-12-07"},
        {"code": "QX-999", "word": "colour", "when": "2026-02-28T23:59:59.5+01:00", "id": "123e4567-e89b-12d3-a456-426614174000"},
        {"code": "AA-001", "when": "1999-12-31T00:00:00Z", "ip": "10.0.255.1", "mail": "ada.lovelace@example.org"},
        {"code": "CD-456", "word": "\ncolor\t", "quoted": "\"\""},
    ]),
    ("strings_lengths", {
        "type": "object",
        "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 4}, "empty": {"type": "string", "maxLength": 0}},
        "required": ["code", "empty"],
        "additionalProperties": False,
    }, [
        {"code": "ab", "empty": ""},
        {"code": "\u00e9\u00e9\u00e9\u00e9", "empty": ""},
        {"code": "a\\b", "empty": ""},
    ]),
]

STYLES = [
    dict(),                                  # {"a": 1, "b": [1, 2]}
    dict(indent=2),
    dict(indent=4, ensure_ascii=False),
    dict(separators=(",", ":")),
    dict(separators=(",", ":"), ensure_ascii=False),
]

MUTATION_CHARS = list('{}[]",:. -01239aeflnrstu\\') + ["\u00e9", "\n"]


def parse_strict(text):
    def bad_constant(name):
        raise ValueError(name)
    return json.loads(text, parse_constant=bad_constant)


def is_valid(validator, text):
    try:
        doc = parse_strict(text)
    except ValueError:
        return False
    return validator.is_valid(doc)


def char_mutants(text, rng, count):
    out = set()
    for _ in range(count * 4):
        if len(out) >= count:
            break
        i = rng.randrange(len(text) + 1)
        op = rng.randrange(3)
        if op == 0 and i < len(text):
            m = text[:i] + text[i + 1:]
        elif op == 1:
            m = text[:i] + rng.choice(MUTATION_CHARS) + text[i:]
        elif i < len(text):
            m = text[:i] + rng.choice(MUTATION_CHARS) + text[i + 1:]
        else:
            continue
        out.add(m)
    return sorted(out)


def semantic_mutants(doc, schema):
    out = []
    if isinstance(doc, dict):
        for k in list(doc):
            d = dict(doc)
            del d[k]
            out.append(d)  # a member left out
            for v in (None, "s", 7, 1.5, True, [], {}):
                d = dict(doc)
                d[k] = v
                out.append(d)  # a member of another type
            v = doc[k]
            near = []
            if isinstance(v, int) and not isinstance(v, bool):  # the integers around it and far away
                near = [v - 1, v + 1, -v, v * 10, v - 100, v + 1000, 0]
            elif isinstance(v, float):  # the decimals just around it and far away (written without an exponent)
                near = [round(v + dx, 4) for dx in (-0.01, 0.01, -0.001, 0.001, -1, 1, 100)] + [-v, v * 10, 0.5]
            elif isinstance(v, str) and v:  # the same string with a character changed, added or taken away
                near = [v[:-1], v + v[-1], "x" + v, v[:1] + "9" + v[2:], v.replace("-", "/"), v.upper(), v.lower()]
            for x in near:
                d = dict(doc)
                d[k] = x
                out.append(d)
        d = dict(doc)
        d["extra_key"] = 1
        out.append(d)
    if isinstance(doc, list):
        out.append(doc + doc[:1] * 5)
        out.append([])
        out.append(doc + ["x"])
    return out


def main():
    rng = random.Random(20261207)
    cases = []
    for name, schema, docs in CASES:
        jsonschema.Draft202012Validator.check_schema(schema)
        # Formats are checked (date-time with rfc3339-validator installed): the grammar writes them.
        checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
        assert {"date", "date-time", "uuid", "ipv4", "email"} <= set(checker.checkers), sorted(checker.checkers)
        validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
        valid, invalid = [], set()
        for doc in docs:
            assert validator.is_valid(doc), (name, doc)
            for style in STYLES:
                text = json.dumps(doc, **style)
                valid.append(text)
                for m in char_mutants(text, rng, 12):
                    if not is_valid(validator, m):
                        invalid.add(m)
            for m in semantic_mutants(doc, schema):
                text = json.dumps(m)
                if not is_valid(validator, text):
                    invalid.add(text)
        # Prefixes of a valid document are not documents.
        for text in valid[:3]:
            invalid.add(text[: len(text) // 2])
        invalid = sorted(t for t in invalid if t not in valid)
        cases.append({"name": name, "schema": schema, "valid": sorted(set(valid)), "invalid": invalid})
    about = ("Made by tools/ref/make_json_schema_fixture.py with jsonschema %s (Draft 2020-12): 'valid' documents "
             "pass its validator, 'invalid' ones fail it or are not JSON (Python's json module, NaN/Infinity "
             "refused)." % importlib.metadata.version("jsonschema"))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"about": about, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %s: %d schemas, %d valid, %d invalid documents" % (
        OUT, len(cases), sum(len(c["valid"]) for c in cases), sum(len(c["invalid"]) for c in cases)))


if __name__ == "__main__":
    main()
