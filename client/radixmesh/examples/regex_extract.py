"""Constrained decoding: extract fields with a regex and with a JSON schema.

python -m radixmesh.examples.regex_extract --endpoint localhost:50051
"""

from __future__ import annotations

import json

import radixmesh as rm
from radixmesh.examples._common import backend, parser, report

DATE = r"\d{4}-\d{2}-\d{2}"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@rm.function
def extract(s: rm.ProgramState, text: str) -> None:
    s += "Text: " + text + "\n"
    s += "Date of the event (YYYY-MM-DD): " + rm.gen("date", regex=DATE) + "\n"
    s += "Person as JSON: " + rm.gen("person", json_schema=SCHEMA, max_tokens=64)


def scripted(prompt: str, params: rm.GenParams) -> str:
    return "1969-07-20" if params.regex else '{"name": "Neil Armstrong", "age": 38}'


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    backend(args, scripted)
    text = "On July 20, 1969, Neil Armstrong, aged 38, became the first person on the Moon."
    state = extract.run(text=text, temperature=0)
    print("date:  ", state["date"])
    print("person:", json.loads(state["person"]))
    report(state)


if __name__ == "__main__":
    main()
