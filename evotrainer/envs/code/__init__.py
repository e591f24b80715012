"""Code domain: generated function-writing tasks, HumanEval, sandboxed test-based verifier."""
from evotrainer.envs.code.domain import DEFAULT_SYSTEM_PROMPT, CodeDomain
from evotrainer.envs.code.generator import TIERS, generate_items, make_item_id, pool_size, split_of
from evotrainer.envs.code.humaneval import humaneval_items, humaneval_path, humaneval_problems, sample_humaneval
from evotrainer.envs.code.verifier import build_solution, extract_code, verify_completion

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "TIERS",
    "CodeDomain",
    "build_solution",
    "extract_code",
    "generate_items",
    "humaneval_items",
    "humaneval_path",
    "humaneval_problems",
    "make_item_id",
    "pool_size",
    "sample_humaneval",
    "split_of",
    "verify_completion",
]
