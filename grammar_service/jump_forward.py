"""Jump-forward proposals: the grammar's forced continuation, retokenized (paper appendix B.2).

When the grammar admits exactly one continuation string, the scheduler can append it in one
forward pass instead of decoding it token by token. String and token boundaries differ, so the
paper retokenizes the text around the boundary. The scheduler holds token ids only (the
tokenizer lives in the front door), so the grammar service, which has the tokenizer anyway,
proposes the token form: "drop your last `rollback` tokens, append `tokens`".

How a proposal is made:
1. Take the request's last `window` accepted tokens (fewer if the matcher cannot undo that
   many), shrunk from the left until their bytes are whole UTF-8 characters.
2. Encode window text + forced text; keep the common prefix with the window's tokens; the rest
   of the window is rolled back and the rest of the encoding is appended.
3. Check: the new tokens' bytes must equal window bytes + forced text (tokenizers that add a
   prefix space fail this), and a fork of the matcher, rolled back, must accept every new token.
   A failed check yields the text with no tokens (the scheduler may retokenize itself or skip).

The proposal is never applied here: the scheduler applies it (Truncate+Extend to the model,
Rollback+accept to us), which keeps its token log the single source of truth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grammar_service.matchers import RequestMatcher


@dataclass(frozen=True, slots=True)
class JumpProposal:
    text: str
    rollback: int = 0
    tokens: list[int] = field(default_factory=list)


class Retokenizer:
    def __init__(self, tokenizer: Any, token_bytes: Sequence[bytes], window: int = 8) -> None:
        """`tokenizer`: a Hugging Face tokenizer; `token_bytes[id]`: the exact bytes of each
        token (xgrammar's `TokenizerInfo.decoded_vocab`)."""
        self._token_bytes = token_bytes
        self.window = max(0, window)
        # Why the backend: its encode neither mutates tokenizer state nor adds special tokens,
        # so concurrent sessions' threads may call it at once.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            self._encode = lambda text: list(backend.encode(text, add_special_tokens=False).ids)
        else:
            self._encode = lambda text: list(tokenizer.encode(text, add_special_tokens=False))

    def _bytes(self, ids: Sequence[int]) -> bytes:
        vocab = self._token_bytes
        return b"".join(vocab[i] if 0 <= i < len(vocab) else b"\x00\xff" for i in ids)

    def propose(self, m: RequestMatcher) -> JumpProposal | None:
        """None when the grammar forces nothing; otherwise the forced text and, when checks
        pass, the token form. Does not change `m`."""
        if m.terminated:
            return None
        text = m.jump_forward_string()
        if not text:
            return None
        window = m.tail(min(self.window, m.undoable))
        head = b""
        while True:  # drop tokens from the left until the window is whole characters
            head = self._bytes(window)
            try:
                prefix = head.decode("utf-8")
                break
            except UnicodeDecodeError:
                window = window[1:]
        ids = self._encode(prefix + text)
        if self._bytes(ids) != head + text.encode("utf-8"):
            return JumpProposal(text)
        keep = 0
        while keep < min(len(ids), len(window)) and ids[keep] == window[keep]:
            keep += 1
        rollback, tokens = len(window) - keep, ids[keep:]
        if not tokens or not self._accepts(m, rollback, tokens):
            return JumpProposal(text)
        return JumpProposal(text, rollback, tokens)

    @staticmethod
    def _accepts(m: RequestMatcher, rollback: int, tokens: Sequence[int]) -> bool:
        probe = m.matcher.fork()
        if rollback:
            probe.rollback(rollback)
        return all(probe.accept_token(t) for t in tokens)
