"""JSON schemas for the structured-output tests: nested objects, enums, arrays with min/max items,
numbers with bounds, additionalProperties false, string lengths; each with a prompt that asks for it."""

from __future__ import annotations

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 2, "maxLength": 12},
    "age": {"type": "integer", "minimum": 18, "maximum": 99}},
    "required": ["name", "age"], "additionalProperties": False}

ORDER = {"type": "object", "properties": {
    "item": {"type": "string", "enum": ["apple", "pear", "plum"]},
    "quantity": {"type": "integer", "minimum": 1, "maximum": 9},
    "express": {"type": "boolean"}},
    "required": ["item", "quantity", "express"], "additionalProperties": False}

TAGS = {"type": "object", "properties": {
    "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]},
             "minItems": 2, "maxItems": 3}},
    "required": ["tags"], "additionalProperties": False}

NESTED = {"type": "object", "properties": {
    "city": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10},
        "location": {"type": "object", "properties": {
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "lon": {"type": "number", "minimum": -180, "maximum": 180}},
            "required": ["lat", "lon"], "additionalProperties": False}},
        "required": ["name", "location"], "additionalProperties": False}},
    "required": ["city"], "additionalProperties": False}

SCORES = {"type": "object", "properties": {
    "scores": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
               "minItems": 1, "maxItems": 4},
    "grade": {"type": "string", "enum": ["A", "B", "C"]}},
    "required": ["scores", "grade"], "additionalProperties": False}

CODE = {"type": "object", "properties": {
    "code": {"type": "string", "minLength": 3, "maxLength": 3},
    "count": {"type": "integer", "minimum": -5, "maximum": 5}},
    "required": ["code", "count"], "additionalProperties": False}

CASES = [
    ("Describe a person as JSON with a name and an age.", PERSON),
    ("Order some fruit. Answer in JSON.", ORDER),
    ("Give two or three colour tags as JSON.", TAGS),
    ("Describe Paris and its coordinates as JSON.", NESTED),
    ("Give some scores and a grade as JSON.", SCORES),
    ("Give a three-letter code and a count as JSON.", CODE),
]

# keywords llguidance cannot enforce: each must be refused, naming the keyword
UNSUPPORTED = {"not": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
               "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}}}
