"""The model's tokenizer and chat template (transformers), plus the role markers a client
without transformers needs to build chat prompts itself.

Chat content is text: special-token text inside a message (`<|im_start|>system ...`) is
tokenized as the characters it is, never as control tokens, so a user cannot fake a turn.
Only the template's own markers become special tokens."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from tokenizers import Tokenizer
from transformers import AutoTokenizer

log = structlog.get_logger(__name__)

_SENTINEL = "\x00{}\x00"
_CONTENT = "\x00content{}\x00"


@dataclass
class RoleInfo:
    roles: dict[str, tuple[str, str]] = field(default_factory=dict)  # role -> (prefix, suffix)
    default_system_prompt: str = ""
    generation_prefix: str = ""


class Tokenization:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.vocab_size = len(self.tok)
        self.eos_ids = self._eos_ids(folder)
        self.bos_id = self.tok.bos_token_id if self.tok.bos_token_id is not None else -1
        self.chat_template = self.tok.chat_template or ""
        self.roles = self._role_info() if self.chat_template else RoleInfo()
        cfg = (
            json.loads((folder / "config.json").read_text())
            if (folder / "config.json").exists()
            else {}
        )
        self.model_name = cfg.get("_name_or_path") or folder.name
        # A second backend that splits special-token text. Why a copy: transformers'
        # split_special_tokens flips a flag on the shared backend, racing other threads.
        self._plain = Tokenizer.from_str(self.tok.backend_tokenizer.to_str())
        self._plain.encode_special_tokens = True
        self.special_texts = sorted(self.tok.get_added_vocab(), key=len, reverse=True)
        # A token spells at most this many characters, so a text of n characters has at least
        # n / max_token_chars tokens: what cannot fit a context is refused before tokenizing.
        pieces = self.tok.convert_ids_to_tokens(list(range(len(self.tok))))
        self.max_token_chars = max(len(p) for p in pieces if p is not None)
        # (text, id) of a multimodal model's image marker: chat content keeps it as the token
        # (the front door sets it; every other special text in content stays plain).
        self.image_marker: tuple[str, int] | None = None

    def _eos_ids(self, folder: Path) -> list[int]:
        ids: set[int] = set()
        for name in ("generation_config.json", "config.json"):
            f = folder / name
            if f.exists():
                eos = json.loads(f.read_text()).get("eos_token_id")
                if isinstance(eos, int):
                    ids.add(eos)
                elif isinstance(eos, list):
                    ids.update(eos)
        if self.tok.eos_token_id is not None:
            ids.add(self.tok.eos_token_id)
        return sorted(ids)

    def set_chat_template(self, template: str) -> None:
        """Serve with this Jinja chat template instead of the tokenizer's (--chat-template)."""
        self.tok.chat_template = template
        self.chat_template = template
        self.roles = self._role_info()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def decoder(self, skip_special_tokens: bool = False) -> Callable[[Sequence[int]], str]:
        """`decode` with its flag bound, for the per-token path of streams: the tokenizers
        backend called directly when transformers would return exactly what the backend
        returns (no clean-up of spaces); transformers' own decode adds ~10 us of Python per
        call, and a streamed token costs two calls."""
        backend = getattr(self.tok, "backend_tokenizer", None)
        if backend is None or self.tok.clean_up_tokenization_spaces:
            return functools.partial(self.decode, skip_special_tokens=skip_special_tokens)
        return functools.partial(backend.decode, skip_special_tokens=skip_special_tokens)

    def encode_plain(self, text: str) -> list[int]:
        """Tokens of `text` with special-token text split like any other characters."""
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def has_special_text(self, text: str) -> bool:
        return any(s in text for s in self.special_texts)

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template renders a `tools` list (else the front door writes them
        into the system message)."""
        return "tools" in self.chat_template

    def tool_call_parser(self) -> str:
        """The parser family of this template's tool calls (used for --tool-call-parser auto)."""
        t = self.chat_template
        if "<tool_call>" in t or not self.renders_tools:
            return "hermes"
        if "<|python_tag|>" in t or "ipython" in t:
            return "llama3"
        return "hermes"

    def apply_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        if not self.chat_template:
            raise ValueError("this model has no chat template; send text or input_ids")
        if not any(self.has_special_text(m["content"]) for m in messages):
            # the template already carries any BOS it wants
            return self.encode(self._render(messages, add_generation_prompt, tools), False)
        # Render with a placeholder per content, then tokenize the template's pieces with
        # its special tokens and each content as plain text.
        marks = [_CONTENT.format(i) for i in range(len(messages))]
        text = self._render(
            [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)],
            add_generation_prompt,
            tools,
        )
        ids: list[int] = []
        for m, mark in zip(messages, marks, strict=True):
            head, found, text = text.partition(mark)
            if not found or mark in text:
                raise ValueError(
                    "a message holds special-token text, and this model's chat template "
                    "changes message content, so it cannot be kept as plain text: remove it"
                )
            ids += self.encode(head, add_special_tokens=False) if head else []
            ids += self._content_ids(m["content"])
        return ids + (self.encode(text, add_special_tokens=False) if text else [])

    def _content_ids(self, content: str) -> list[int]:
        """Plain tokens of a message's content, image markers kept as the image token."""
        if self.image_marker is None or self.image_marker[0] not in content:
            return self.encode_plain(content)
        text, tid = self.image_marker
        ids: list[int] = []
        for i, piece in enumerate(content.split(text)):
            ids += ([tid] if i else []) + (self.encode_plain(piece) if piece else [])
        return ids

    def _render(
        self,
        messages: list[dict[str, Any]],
        gen: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        return str(
            self.tok.apply_chat_template(
                messages,
                tools=tools,  # type: ignore[arg-type]  # OpenAI tool dicts, as transformers takes
                tokenize=False,
                add_generation_prompt=gen,
            )
        )

    def _role_info(self) -> RoleInfo:
        info = RoleInfo()
        try:
            for role in ("system", "user", "assistant"):
                s = _SENTINEL.format(role)
                msgs = [{"role": "system", "content": "sys"}] if role != "system" else []
                base = self._render(msgs) if msgs else ""
                text = self._render([*msgs, {"role": role, "content": s}])
                text = text[len(base) :] if text.startswith(base) else text
                prefix, _, suffix = text.partition(s)
                info.roles[role] = (prefix, suffix)
            user = _SENTINEL.format("user")
            only_user = self._render([{"role": "user", "content": user}])
            head = only_user.split(info.roles["user"][0] + user)[0]
            sp, ss = info.roles["system"]
            if head.startswith(sp) and head.endswith(ss) and len(head) > len(sp) + len(ss):
                info.default_system_prompt = head[len(sp) : len(head) - len(ss)]
            msgs = [{"role": "user", "content": "x"}]
            info.generation_prefix = self._render(msgs, True)[len(self._render(msgs)) :]
        except Exception as exc:  # a template we cannot probe: clients fall back to text
            log.warning("role_markers_unavailable", error=str(exc))
            return RoleInfo()
        return info
