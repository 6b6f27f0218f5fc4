"""OpenAI's Predicted Outputs: `prediction: {"type": "content", "content": text | [{"type": "text", "text": ...}]}`.

Chat, completions and the Responses API (which has no such field at OpenAI: the same shape and rules here).
The text goes to the worker as `GenerateRequest.prediction`, whose tokens become draft tokens there
(worker/engine/drafts.py): it never changes the answer, only how fast it comes. Unlike OpenAI, a prediction may
come with n > 1, logprobs, penalties and tools (the worker verifies every draft token through the full logits
pipeline). It is bounded like a prompt: by the body's size at the edge, by its bytes in the token reservation
(gateway/limits/tokens.py), and by the model's context at the worker (a longer one is refused as too long).
"""

from __future__ import annotations

from gateway.serving.dialect import check, fail


def prediction_text(prediction: dict | None) -> str | None:
    """The predicted text, None when there is none; a malformed prediction is a 400 naming `prediction`."""
    if prediction is None:
        return None
    check(prediction.get("type") == "content", "prediction.type must be 'content'", "prediction")
    unknown = sorted(set(prediction) - {"type", "content"})
    check(not unknown, f"prediction has unknown fields: {', '.join(unknown)}", "prediction")
    content = prediction.get("content")
    if isinstance(content, str):
        return content or None
    if not isinstance(content, list):
        fail("prediction.content must be a string or a list of text parts", "prediction")
    texts = []
    for part in content:
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                and set(part) <= {"type", "text"}):
            fail("prediction.content parts must be {\"type\": \"text\", \"text\": string}", "prediction")
        texts.append(part["text"])
    return "".join(texts) or None
