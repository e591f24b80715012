"""Math domain: tiered arithmetic generator, answer verifier and JSONL loader."""
from evotrainer.envs.math.domain import DEFAULT_SYSTEM_PROMPT, MathDomain
from evotrainer.envs.math.generator import TIERS, generate_items, make_item_id, split_of
from evotrainer.envs.math.loader import gsm8k_answer, load_jsonl
from evotrainer.envs.math.verifier import answers_match, extract_answer, verify_completion

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "TIERS",
    "MathDomain",
    "answers_match",
    "extract_answer",
    "generate_items",
    "gsm8k_answer",
    "load_jsonl",
    "make_item_id",
    "split_of",
    "verify_completion",
]
