"""Load external math sets (e.g. GSM8K) from JSONL into Items."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from evotrainer.envs.base import Item


def gsm8k_answer(raw: str) -> str:
    """GSM8K solutions end with "#### 42": take what follows the last ####, without commas."""
    if "####" in raw:
        raw = raw.rsplit("####", 1)[1]
    return raw.strip().replace(",", "").rstrip(".").strip()


def load_jsonl(
    path: str | Path,
    *,
    question_key: str = "question",
    answer_key: str = "answer",
    id_key: str | None = None,
    source: str | None = None,
) -> list[Item]:
    """One Item per non-blank line. Raises ValueError("<file>:<line>: ...") on bad input.

    `source` defaults to the file's stem. Without `id_key`, item_id is a content hash
    ("x-" + 12 hex of sha256(source, question, answer)); identical (question, answer) lines are
    kept once. With `id_key`, duplicate ids are an error.
    """
    p = Path(path)
    src = source if source is not None else p.stem
    items: list[Item] = []
    seen: set[str] = set()
    with p.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                rec: Any = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            for key in (question_key, answer_key) + ((id_key,) if id_key else ()):
                if key not in rec or rec[key] is None:
                    raise ValueError(f"{where}: missing key {key!r} (keys: {sorted(rec)[:10]})")
            question = str(rec[question_key]).strip()
            raw_answer = str(rec[answer_key])
            answer = gsm8k_answer(raw_answer)
            if not question:
                raise ValueError(f"{where}: empty {question_key!r}")
            if not answer:
                raise ValueError(f"{where}: empty answer in {answer_key!r}")
            if id_key:
                item_id = str(rec[id_key])
                if item_id in seen:
                    raise ValueError(f"{where}: duplicate id {item_id!r} in {id_key!r}")
            else:
                h = hashlib.sha256(f"{src}\x1f{question}\x1f{answer}".encode()).hexdigest()
                item_id = "x-" + h[:12]
                if item_id in seen:
                    continue
            seen.add(item_id)
            meta: dict[str, Any] = {"line": lineno}
            if raw_answer.strip() != answer:
                meta["solution"] = raw_answer
            items.append(Item(item_id=item_id, question=question, answer=answer, tier=0, source=src, meta=meta))
    return items
