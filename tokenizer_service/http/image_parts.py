"""Images in HTTP bodies: OpenAI chat `image_url` parts and SGLang `/generate` `image_data`.

Only inline images are taken: a data URL (`data:image/png;base64,...`) or, for SGLang's
`image_data`, bare base64. A remote URL is refused with a message that says how to send the
image instead: the front door does not fetch arbitrary addresses (a request could make the
server probe its own network). Decoding the image itself happens later, in the core's pool
(tokenizer_service/images.py), where the bounds are.
"""

from __future__ import annotations

import base64
import binascii

from tokenizer_service.http.errors import HttpError

MARKER = "<image>"  # where an image goes in text (LLaVA's image token)
MAX_REF_CHARS = 40 * 1024 * 1024  # base64 of the largest image the bounds allow, and more


def image_bytes(ref: str, param: str, bare_base64: bool = False) -> bytes:
    """The bytes of one inline image reference; HttpError(400) for anything else."""
    if len(ref) > MAX_REF_CHARS:
        raise HttpError(
            400, f"{param}: the image is larger than {MAX_REF_CHARS} characters", param=param
        )
    low = ref[:16].lower()
    if low.startswith(("http://", "https://", "ftp://", "file:")):
        raise HttpError(
            400,
            f"{param}: remote image URLs are not fetched; send the image inline as a data URL "
            "(data:image/png;base64,...)",
            param=param,
        )
    if low.startswith("data:"):
        head, sep, data = ref.partition(",")
        if not sep or not head.endswith(";base64"):
            raise HttpError(
                400, f"{param}: a data URL must be base64 (data:image/...;base64,...)", param=param
            )
        ref = data
    elif not bare_base64:
        raise HttpError(
            400, f"{param}: expected a data URL (data:image/png;base64,...)", param=param
        )
    try:
        return base64.b64decode(ref, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HttpError(
            400, f"{param}: the image is not valid base64 ({exc})", param=param
        ) from exc
