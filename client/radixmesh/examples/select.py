"""select: pick the likeliest of several choices, with each scoring method.

python -m radixmesh.examples.select --endpoint localhost:50051
"""

from __future__ import annotations

import radixmesh as rm
from radixmesh.examples._common import backend, parser, report

METHODS: dict[str, rm.ChoicesMethod] = {
    "token_length_normalized": rm.token_length_normalized,
    "greedy_token": rm.greedy_token,
    "unconditional_normalized": rm.unconditional_normalized,
}


@rm.function
def sentiment(s: rm.ProgramState, review: str, method: rm.ChoicesMethod) -> None:
    s += "Review: " + review + "\nSentiment (positive, negative or mixed):"
    s += rm.select("label", [" positive", " negative", " mixed"], choices_method=method)


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    backend(args)
    review = "The food was wonderful but we waited an hour for a table."
    for name, method in METHODS.items():
        state = sentiment.run(review=review, method=method)
        meta = state.get_meta_info("label").source  # the SelectResult behind SGLang's dict
        assert isinstance(meta, rm.SelectResult)
        scores = ", ".join(f"{x:.3f}" for x in meta.scores)
        print(f"{name:26s} -> {state['label'].strip():9s} scores [{scores}]")
    report(state)


if __name__ == "__main__":
    main()
