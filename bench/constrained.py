"""`radixmesh bench constrained`: what constrained decoding costs on the CPU stack.

(a) compile cost (grammar service with xgrammar's cache off), (b) constrained vs unconstrained
throughput, mask stall. Filled in below."""

from __future__ import annotations

from typing import Any

from grammar_service.suite import SUITE, GrammarCase

# One chat prompt per suite grammar, asking for what the grammar allows, and the output budget
# that lets the greedy and the seeded runs finish (integration test: < 10 % cut by length).
PROMPTS: dict[str, tuple[str, int]] = {
    "person": ("Give me a JSON object for a person named Ada who is 36 years old, with the keys "
               "name and age.", 48),
    "nested_address": ("Return JSON for a customer named Bo who lives at 1 Rue X, Paris, zip "
                       "75001: keys name and address (street, city, zip).", 64),
    "int_array": ("Give a JSON array of three small integers.", 48),
    "status_enum": ("Is the account active, inactive or banned? Answer with a JSON string.", 48),
    "bounded_numbers": ("Report today's weather as JSON with temperature in Celsius, humidity "
                        "in percent and pressure in hPa.", 64),
    "pattern_fields": ("Return JSON with a phone number and a product code like ABC-12.", 64),
    "optional_fields": ("Return a JSON user record with id 7, nick ada and admin false.", 48),
    "bool_null": ("Return JSON where flag is true and nothing is null.", 48),
    "deep_nesting": ("Return JSON where a.b.c.d is 3.", 48),
    "object_array": ("List two items as a JSON array of objects with an id and a tag (red, "
                     "green or blue).", 64),
    "any_of": ("Reply with a short JSON value: one word or a number.", 48),
    "const_version": ("Return JSON with version 1.0 and ok true.", 48),
    "tool_call": ("Call a tool to search the web for sglang with limit 5. Reply with JSON: "
                  "name and arguments.", 64),
    "character": ("Describe Hermione Granger as JSON: name, house, blood_status, wand (wood, "
                  "core, length) and alive.", 96),
    "defs_ref": ("Return JSON with two points, from and to, each with x and y between -9 and 9.",
                 64),
    "free_text": ("Give a short title and two tags for a blog post about cooking, as JSON.", 96),
    "paper_summary_grade": ("Summarize the essay 'My summer holiday' in one sentence and grade "
                            "it A, B, C or D. Reply in JSON with summary and grade.", 96),
    "ipv4": ("What is the IP address of a typical home router?", 48),
    "iso_date": ("What is the date of the first moon landing? Answer as YYYY-MM-DD.", 48),
    "choice": ("Is the sky blue? Answer yes, no or maybe.", 48),
    "email": ("Write an example email address.", 48),
    "us_phone": ("Write an example US phone number.", 48),
    "ebnf_digits": ("List up to four digits in parentheses, separated by commas.", 48),
    "ebnf_answer": ("Is water wet? Answer yes, no or unsure.", 48),
}


def constrained_request(case: GrammarCase, *, temperature: float = 0.0, seed: int | None = None,
                        max_new_tokens: int | None = None, constrained: bool = True
                        ) -> dict[str, Any]:
    """Client.generate keyword arguments for one suite case (chat prompt, its grammar)."""
    prompt, budget = PROMPTS[case.name]
    kw: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}],
                          "max_new_tokens": max_new_tokens or budget,
                          "temperature": temperature}
    if seed is not None:
        kw["seed"] = seed
    if constrained:
        kw[case.kind.value] = case.text
    return kw


assert set(PROMPTS) == {c.name for c in SUITE}, "every suite grammar needs a prompt"
