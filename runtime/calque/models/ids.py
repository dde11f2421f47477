"""Identifiers that become parts of S3 keys (run ids, claim ids): a safe character set, checked in the models.

A claim id of ``../../x`` once made a worker write its Summary under a literal ``../`` key; every
model that carries such an id validates it here, so a crafted message fails validation before any
key is built from it.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

MAX_ID_LENGTH = 128
_SAFE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_ID_LENGTH - 1}}}")
RULE = f"1 to {MAX_ID_LENGTH} characters from A-Z a-z 0-9 . _ -, starting with a letter or digit, without '..'"


def is_safe_id(text: object) -> bool:
    """True when ``text`` may be used as one segment of an S3 key."""
    return isinstance(text, str) and _SAFE.fullmatch(text) is not None and ".." not in text


def check_id(text: str, what: str = "") -> str:
    """``text`` unchanged, or ValueError naming it and the rule."""
    if not is_safe_id(text):
        named = f"{what} {text!r}" if what else repr(text)
        raise ValueError(f"{named} is not a safe identifier: use {RULE}")
    return text


SafeId = Annotated[str, AfterValidator(check_id)]
"""A run id, claim id or other name that becomes one S3 key segment."""
