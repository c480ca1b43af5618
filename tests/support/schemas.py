"""JSON Schemas as clients write them: Pydantic v2 models, zod (zod-to-json-schema)
output and the examples of OpenAI's strict-mode docs, for the structured-output tests."""

from __future__ import annotations

import datetime
import enum
import uuid
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import BaseModel, Field


class Color(enum.Enum):
    red = "red"
    green = "green"


class Address(BaseModel):
    city: str
    zip: str | None = None


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Person(BaseModel):
    """Optional, nested, Enum, list of models, Literal and a discriminated union."""

    name: str
    nick: str | None
    color: Color
    home: Address
    past: list[Address]
    mood: Literal["calm", "busy"]
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]


class Node(BaseModel):
    """A recursive model: a tree."""

    label: str
    children: list[Node]


class Formats(BaseModel):
    when: datetime.datetime
    day: datetime.date
    id: uuid.UUID
    code: str = Field(pattern=r"^[A-Z]{3}-\d{2}$")
    pair: tuple[int, str]
    counts: dict[str, int]
    tags: set[Literal["a", "b", "c"]]
    price: float = Field(gt=0, multiple_of=0.25)


PYDANTIC: list[type[BaseModel]] = [Person, Node, Formats, Address]

ZOD: dict[str, Any] = {
    "type": "object",
    "properties": {
        "owner": {
            "type": "object",
            "properties": {
                "email": {"type": "string", "format": "email"},
                "site": {"type": "string", "format": "uri"},
            },
            "required": ["email"],
            "additionalProperties": False,
        },
        "friend": {"$ref": "#/properties/owner"},
        "nick": {"type": ["string", "null"]},
        "pair": {
            "type": "array",
            "minItems": 2,
            "maxItems": 2,
            "items": [{"type": "number"}, {"type": "string", "format": "date-time"}],
        },
        "pets": {
            "type": "array",
            "items": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"kind": {"type": "string", "const": "cat"}},
                        "required": ["kind"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {
                            "kind": {"type": "string", "const": "dog"},
                            "age": {"type": "integer", "exclusiveMinimum": 0},
                        },
                        "required": ["kind", "age"],
                        "additionalProperties": False,
                    },
                ]
            },
        },
    },
    "required": ["owner", "friend", "nick", "pair", "pets"],
    "additionalProperties": False,
    "$schema": "http://json-schema.org/draft-07/schema#",
}

#: OpenAI's strict-mode docs: a recursive UI tree (``$ref: "#"``) and a linked list.
UI: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["div", "button", "header", "section", "form"]},
        "label": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#"}},
        "attributes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "value": {"type": "string"}},
                "required": ["name", "value"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["type", "label", "children", "attributes"],
    "additionalProperties": False,
}
LINKED_LIST: dict[str, Any] = {
    "type": "object",
    "properties": {"linked_list": {"$ref": "#/$defs/linked_list_node"}},
    "$defs": {
        "linked_list_node": {
            "type": "object",
            "properties": {
                "value": {"type": "number"},
                "next": {"anyOf": [{"$ref": "#/$defs/linked_list_node"}, {"type": "null"}]},
            },
            "additionalProperties": False,
            "required": ["next", "value"],
        }
    },
    "additionalProperties": False,
    "required": ["linked_list"],
}
ALL_OF: dict[str, Any] = {
    "allOf": [
        {"$ref": "#/definitions/Base"},
        {
            "type": "object",
            "properties": {"extra": {"type": "integer", "multipleOf": 5}},
            "required": ["extra"],
        },
    ],
    "definitions": {
        "Base": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "ip": {"type": "string", "format": "ipv4"},
            },
            "required": ["id"],
        }
    },
}
ONE_OF: dict[str, Any] = {
    "type": "object",
    "properties": {
        "shape": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"t": {"const": "circle"}, "r": {"type": "number"}},
                    "required": ["t", "r"],
                },
                {
                    "type": "object",
                    "properties": {"t": {"const": "square"}, "side": {"type": "number"}},
                    "required": ["t", "side"],
                },
            ],
            "discriminator": {"propertyName": "t"},
        },
        "scores": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
        "day": {"type": "string", "format": "date"},
    },
    "required": ["shape", "scores", "day"],
}

#: Every schema above, by name: the models' own and the hand-written ones.
SCHEMAS: dict[str, dict[str, Any]] = {
    **{m.__name__: m.model_json_schema() for m in PYDANTIC},
    "zod": ZOD,
    "ui": UI,
    "linked_list": LINKED_LIST,
    "all_of": ALL_OF,
    "one_of": ONE_OF,
}

#: Features still refused, each with a schema that uses it.
REFUSED: dict[str, dict[str, Any]] = {
    "not": {"type": "string", "not": {"const": "a"}},
    "if/then": {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
    "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
    "minProperties": {"type": "object", "minProperties": 1},
    "remote $ref": {"$ref": "https://example.com/schema.json"},
    "a $ref to nothing": {"$ref": "#/$defs/missing"},
    "overlapping oneOf": {"oneOf": [{"type": "number"}, {"type": "integer"}]},
    "recursion without an end": {
        "$ref": "#/$defs/A",
        "$defs": {
            "A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}
        },
    },
    "a pattern Python cannot read": {"type": "string", "pattern": "a(?<name"},
    "a pattern no string of its length matches": {
        "type": "string",
        "pattern": "^[0-9]{5}$",
        "maxLength": 3,
    },
    "allOf of conflicting types": {"allOf": [{"type": "string"}, {"type": "integer"}]},
}


def validate(document: Any, schema: dict[str, Any]) -> None:
    """Validate as a client would, formats included (the validator of the schema's
    ``$schema``, else draft 2020-12)."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(document)
