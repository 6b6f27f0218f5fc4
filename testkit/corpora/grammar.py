"""Schemas and regexes every constrained output is checked against (tests and benches share them).

Each entry is (name, schema). Sizes are bounded (maxLength, maxItems) where the model could otherwise
ramble, so a generous max_tokens finishes almost every case; a cut one must then say `incomplete`.
"""

from __future__ import annotations

_NAME = {"type": "string", "minLength": 1, "maxLength": 20}

SCHEMAS: list[tuple[str, dict]] = [
    ("person", {"type": "object", "properties": {"name": _NAME, "age": {"type": "integer"}},
                "required": ["name", "age"]}),
    ("nested_address", {"type": "object", "properties": {
        "name": _NAME,
        "address": {"type": "object", "properties": {"street": _NAME, "city": _NAME,
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street", "city", "zip"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False}),
    ("int_array", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5}),
    ("color_enum", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                    "required": ["color"]}),
    ("bounded_int", {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 10}},
                     "required": ["score"]}),
    ("bounded_number", {"type": "object", "properties": {
        "temperature": {"type": "number", "minimum": -50, "maximum": 60}}, "required": ["temperature"]}),
    ("optional_fields", {"type": "object", "properties": {
        "title": _NAME, "subtitle": _NAME, "pages": {"type": "integer", "minimum": 0}},
        "required": ["title"], "additionalProperties": False}),
    ("ref_defs", {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"},
                                                                       "y": {"type": "integer"}},
                                      "required": ["x", "y"], "additionalProperties": False}},
                  "type": "object", "properties": {"start": {"$ref": "#/$defs/point"},
                                                   "end": {"$ref": "#/$defs/point"}},
                  "required": ["start", "end"], "additionalProperties": False}),
    ("ref_definitions", {"definitions": {"tag": {"type": "string", "enum": ["a", "b", "c"]}},
                         "type": "object", "properties": {"tags": {"type": "array",
                                                                   "items": {"$ref": "#/definitions/tag"},
                                                                   "maxItems": 3}},
                         "required": ["tags"]}),
    ("format_date", {"type": "object", "properties": {"born": {"type": "string", "format": "date"}},
                     "required": ["born"]}),
    ("format_email", {"type": "object", "properties": {"email": {"type": "string", "format": "email"}},
                      "required": ["email"]}),
    ("format_uuid", {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}},
                     "required": ["id"]}),
    ("format_ipv4", {"type": "object", "properties": {"ip": {"type": "string", "format": "ipv4"}},
                     "required": ["ip"]}),
    ("format_datetime", {"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}},
                         "required": ["at"]}),
    ("boolean", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}),
    ("const", {"type": "object", "properties": {"version": {"const": 2}, "kind": {"const": "event"}},
               "required": ["version", "kind"]}),
    ("any_of", {"type": "object", "properties": {"value": {"anyOf": [{"type": "string", "maxLength": 10},
                                                                     {"type": "integer"}]}},
                "required": ["value"]}),
    ("array_of_objects", {"type": "array", "maxItems": 3, "minItems": 1, "items": {
        "type": "object", "properties": {"sku": _NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["sku", "qty"], "additionalProperties": False}}),
    ("string_pattern", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
                        "required": ["code"]}),
    ("string_lengths", {"type": "object", "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 8}},
                        "required": ["word"]}),
    ("nullable", {"type": "object", "properties": {"nickname": {"type": ["string", "null"], "maxLength": 12}},
                  "required": ["nickname"]}),
    ("closed_nested", {"type": "object", "additionalProperties": False, "required": ["meta", "data"], "properties": {
        "meta": {"type": "object", "additionalProperties": False, "required": ["page"],
                 "properties": {"page": {"type": "integer", "minimum": 1}}},
        "data": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 10}}}}),
    ("tuple", {"type": "array", "prefixItems": [{"type": "string", "maxLength": 10}, {"type": "integer"},
                                                {"type": "boolean"}], "items": False, "minItems": 3}),
    ("matrix", {"type": "array", "minItems": 2, "maxItems": 2,
                "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer"}}}),
    ("int_enum", {"type": "object", "properties": {"level": {"type": "integer", "enum": [1, 2, 3]}},
                  "required": ["level"]}),
    ("deep", {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "object", "required": ["b"], "properties": {
            "b": {"type": "object", "required": ["c"], "properties": {"c": {"type": "integer"}}}}}}}),
    ("top_array_strings", {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 4}),
    ("top_enum", {"enum": ["cat", "dog", "bird"]}),
    ("top_integer", {"type": "integer", "minimum": 0, "maximum": 1000}),
    ("many_fields", {"type": "object", "additionalProperties": False, "properties": {
        "id": {"type": "integer"}, "name": _NAME, "email": {"type": "string", "format": "email"},
        "active": {"type": "boolean"}, "role": {"enum": ["admin", "user"]}, "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2}},
        "required": ["id", "name", "email", "active", "role", "score", "tags"]}),
    ("ref_chain", {"$defs": {"name": _NAME, "person": {"type": "object",
                                                      "properties": {"name": {"$ref": "#/$defs/name"}},
                                                      "required": ["name"], "additionalProperties": False}},
                   "type": "object", "properties": {"author": {"$ref": "#/$defs/person"},
                                                    "editor": {"$ref": "#/$defs/person"}},
                   "required": ["author"], "additionalProperties": False}),
    ("typed_map", {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3}),
    ("exclusive_bounds", {"type": "object", "properties": {"ratio": {"type": "number", "exclusiveMinimum": 0,
                                                                     "exclusiveMaximum": 1}}, "required": ["ratio"]}),
    ("one_of_types", {"type": "object", "properties": {"id": {"oneOf": [{"type": "integer"}, {"type": "null"}]}},
                      "required": ["id"]}),
    ("array_bounds", {"type": "object", "properties": {"scores": {
                          "type": "array", "minItems": 1, "maxItems": 4,
                          "items": {"type": "integer", "minimum": 0, "maximum": 100}}},
                      "required": ["scores"]}),
]

REGEXES: list[tuple[str, str]] = [
    ("phone", r"\d{3}-\d{4}"),
    ("email_like", r"[a-z]{1,10}@[a-z]{1,10}\.(com|org)"),
    ("yes_no", r"(yes|no)"),
    ("iso_date", r"\d{4}-\d{2}-\d{2}"),
    ("capitalised_words", r"[A-Z][a-z]{2,10}( [A-Z][a-z]{2,10})?"),
    ("decimal", r"(0|[1-9]\d{0,5})(\.\d{1,3})?"),
    ("hex_color", r"#[0-9a-f]{6}"),
    ("ipv4", r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)"),
    ("plate", r"[A-Z]{2}\d{2} [A-Z]{3}"),
    ("choice_pair", r"(red|green|blue), (small|large)"),
    ("three_words", r"[a-z]{1,8} [a-z]{1,8} [a-z]{1,8}"),
    ("url", r"https://[a-z]{3,12}\.(com|net)/[a-z]{1,8}"),
]

# A small EBNF grammar (GBNF dialect, as SGLang's `ebnf`).
EBNF = 'root ::= "The answer is " answer "."\nanswer ::= "yes" | "no" | "maybe"'
EBNF_PATTERN = r"The answer is (yes|no|maybe)\."
