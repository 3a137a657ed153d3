"""Per-request text assembly: detokenize incrementally, watch stop strings, coalesce chunks."""

from __future__ import annotations

from collections.abc import Iterable

from radixmesh_wire.pb import api_pb2
from tokenizer_service.detokenizer import IncrementalDetokenizer
from tokenizer_service.events import Chunk, Complete, TokenLogprob
from tokenizer_service.routing.deltas import Update
from tokenizer_service.stop_strings import StopMatcher
from tokenizer_service.tokenization import Tokenization

_FINISH = {
    api_pb2.FINISH_REASON_STOP: "stop",
    api_pb2.FINISH_REASON_LENGTH: "length",
    api_pb2.FINISH_REASON_ABORT: "abort",
}


def to_logprobs(lps: Iterable[api_pb2.TokenLogprob]) -> list[TokenLogprob]:
    return [
        TokenLogprob(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in lp.top])
        for lp in lps
    ]


class TextStream:
    def __init__(
        self,
        tok: Tokenization,
        prompt: list[int],
        sampling: api_pb2.SamplingParams,
        stream: bool,
        interval: int,
    ) -> None:
        self.prompt = prompt
        self.stream = stream
        self.detok = IncrementalDetokenizer(tok.decoder(sampling.skip_special_tokens), prompt[-8:])
        self.stops = StopMatcher(list(sampling.stop))
        self.interval = max(interval, 1)
        self.ids: list[int] = []
        self.logprobs: list[api_pb2.TokenLogprob] = []
        self.prompt_logprobs: list[api_pb2.TokenLogprob] = []
        self.text = ""  # text so far, cut at a stop string once matched
        self.emitted = 0  # chars of text already streamed
        self.unsent_ids: list[int] = []
        self.unsent_lps: list[api_pb2.TokenLogprob] = []
        self.unsent_rollback = 0  # ids of sent chunks that a jump-forward dropped
        # Ids applied but not yet detokenized: updates held for the ones queued behind them
        # (`on_delta(hold=True)`) are decoded once, together, when the chunk is released.
        self.pending: list[int] = []
        self.cached = 0
        self.finish = api_pb2.FINISH_REASON_UNSPECIFIED
        self.matched_stop = ""
        self.stopped_by_string = False

    def resume(self, ids: list[int]) -> None:
        """A continuation: the client already has these ids and the text streamed for them
        (text it was sent stops where a stop string could still begin: `safe_length`)."""
        if not ids:
            return
        self.ids.extend(ids)
        self.text = self.detok.push(ids)
        self.emitted = self.stops.safe_length(self.text)

    def on_delta(self, u: Update, hold: bool = False) -> tuple[Chunk | None, bool]:
        """Apply one update; returns (the chunk to stream now, done). `hold`: more updates
        are already waiting, so the chunk waits for them (unless this one ends the stream)."""
        ex = u.extras
        if u.rollback:
            self._rollback(u.rollback)
        self.ids.extend(u.token_ids)
        self.unsent_ids.extend(u.token_ids)
        done = False
        if ex is not None:
            if ex.HasField("cached_tokens"):
                self.cached = ex.cached_tokens
            self.prompt_logprobs.extend(ex.prompt_logprobs)
            self.logprobs.extend(ex.logprobs)
            self.unsent_lps.extend(ex.logprobs)
            done = ex.finish_reason != api_pb2.FINISH_REASON_UNSPECIFIED
        if hold and not done and not self.stops.stops:
            # Its text waits for the updates behind it: the detokenizer decodes the batch
            # once (two decodes) instead of once per update. Not with stop strings: a stop
            # must be found at the update that completes it (ids after it are not output).
            self.pending.extend(u.token_ids)
            return None, False
        old = len(self.text)
        self._detokenize(u.token_ids)
        if done:
            assert ex is not None
            self.text += self.detok.flush()
            self.finish = ex.finish_reason
            if ex.HasField("matched_stop_token"):
                self.matched_stop = str(ex.matched_stop_token)
        hit = self.stops.find(self.text, old) if self.stops.stops else None
        if hit is not None:
            self.text = self.text[: hit[0]]
            self.finish = api_pb2.FINISH_REASON_STOP
            self.matched_stop = hit[1]
            self.stopped_by_string = not done
            done = True
        return (None if hold and not done else self._chunk(done)), done

    def _detokenize(self, ids: list[int]) -> None:
        """The text of the pending ids and then `ids`, appended to `text`."""
        if self.pending:
            ids = self.pending + ids
            self.pending = []
        self.text += self.detok.push(ids)

    def _rollback(self, n: int) -> None:
        """Jump-forward retokenized the tail: drop n tokens. Their text is a prefix of what the
        replacement tokens spell, so text already streamed stays valid; we re-derive the
        detokenizer state from the kept ids and let the new tokens extend it."""
        del self.ids[len(self.ids) - n :]
        del self.logprobs[len(self.logprobs) - min(n, len(self.logprobs)) :]
        drop = min(n, len(self.unsent_ids))
        del self.unsent_ids[len(self.unsent_ids) - drop :]
        self.unsent_rollback += n - drop  # the client must drop these from what it has
        self.detok = IncrementalDetokenizer(self.detok.decode, self.prompt[-8:])
        self.text = self.detok.push(self.ids)  # one push: its text is the whole text
        self.pending = []  # in `ids`, so decoded above

    def held_chunk(self) -> Chunk | None:
        """What held updates would have streamed (before a failure ends the stream)."""
        self._detokenize([])
        return self._chunk(False)

    def _chunk(self, done: bool) -> Chunk | None:
        if not self.stream:
            return None
        if not done and len(self.unsent_ids) < self.interval:
            return None
        safe = len(self.text) if done else self.stops.safe_length(self.text)
        if safe <= self.emitted and not self.unsent_ids and not self.unsent_rollback:
            return None
        chunk = Chunk(
            self.text[self.emitted : safe],
            self.unsent_ids,
            to_logprobs(self.unsent_lps),
            self.unsent_rollback,
        )
        self.emitted = max(self.emitted, safe)
        self.unsent_ids, self.unsent_lps, self.unsent_rollback = [], [], 0
        return chunk

    def complete(self, lp: api_pb2.LogprobOptions) -> Complete:
        return Complete(
            text=self.text,
            output_ids=self.ids,
            finish_reason=_FINISH.get(self.finish, "abort"),
            matched_stop=self.matched_stop,
            prompt_ids=self.prompt,
            cached_tokens=self.cached,
            output_logprobs=to_logprobs(self.logprobs),
            prompt_logprobs=to_logprobs(self.prompt_logprobs),
            # position 0 has no logprob (nothing precedes it), so scores start at max(p, 1)
            prompt_logprobs_from=max(lp.prompt_logprobs_from, 1)
            if lp.HasField("prompt_logprobs_from")
            else 0,
        )
