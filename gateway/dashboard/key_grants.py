"""A key's grants as the keys page's forms write them (the edit form's and the create form's): a model allow-list
(one per line or comma-separated), rates, a monthly token budget and a budget in money, each read strictly and
bounded here; the rule on how much an owner may grant is auth/policy.py's, said at its field."""

from __future__ import annotations

import re

from auth.models import MAX_KEY_MODELS, Limits
from auth.policy import LIMIT_FIELDS
from gateway.dashboard.budget_fields import SPEND_FIELDS, read_spend
from gateway.dashboard.fields import ascii_whole

MAX_MODEL = 200
MAX_LIMIT = 10**12  # far above any real rate or budget; the team's own limit is the real cap
MODEL_SPLIT = re.compile(r"[\s,]+")
MODEL_NAME = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces, as model names are written
GRANT_FIELDS = ("models", *LIMIT_FIELDS, *SPEND_FIELDS)


def read_grants(typed: dict[str, str], errors: dict[str, str]) -> tuple[list[str], Limits | None]:
    """The model allow-list and limits a key form posted (the edit form's and the create form's), each bounded;
    a problem goes into `errors` by field."""
    models = [m for m in MODEL_SPLIT.split(typed.get("models", "")) if m]
    if len(models) > MAX_KEY_MODELS:
        errors["models"] = f"At most {MAX_KEY_MODELS} models."
    elif any(len(m) > MAX_MODEL or not MODEL_NAME.fullmatch(m) for m in models):
        errors["models"] = f"Model names are printable ASCII without spaces, at most {MAX_MODEL} characters each."
    limits: dict[str, int] = {}
    for field in LIMIT_FIELDS:
        raw = typed.get(field, "").strip()
        if raw:
            value = ascii_whole(raw)
            if value is None or value > MAX_LIMIT:
                errors[field] = f"A whole number from 0 to {MAX_LIMIT:,} in the digits 0-9, or empty for none."
            else:
                limits[field] = value
    spend = read_spend(typed, errors)
    return models, (Limits(**limits, spend_budget=spend) if limits or spend else None)  # type: ignore[arg-type]
