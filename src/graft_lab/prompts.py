"""Chat prompts and the context they must fit: a turn's prompt is the chat template over the conversation so
far, and generation needs the prompt, one step's budget and the new tokens inside the target's context.
Checked with the tokenizer alone, so an oversized budget or first turn fails before the weights load."""

from __future__ import annotations

from .config import RunConfig
from .data import Question
from .errors import ConfigError, ContextLimitError


def chat_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]


def context_of(run: RunConfig, model_ctx: int | None) -> int | None:
    """The context a run decodes in: model.max_context capped by the model's own limit (as Target does)."""
    if not model_ctx:
        return run.model.max_context
    return min(run.model.max_context or model_ctx, model_ctx)


def check_budget(run: RunConfig, context: int | None) -> None:
    """tree.total_tokens and gen.max_new_tokens must leave room for a prompt in the context."""
    if not context:
        return
    if run.tree.total_tokens >= context:
        raise ConfigError(f"tree.total_tokens={run.tree.total_tokens} does not fit the target's context ({context} tokens)")
    if run.tree.total_tokens + run.gen.max_new_tokens >= context:
        raise ConfigError(f"gen.max_new_tokens={run.gen.max_new_tokens} plus tree.total_tokens={run.tree.total_tokens} "
                          f"fill the target's whole context ({context} tokens): no room is left for a prompt")


def check_first_turns(questions: list[Question], tokenizer, context: int | None, source: str) -> None:
    """Every question's first prompt must leave room for a token (later turns depend on the answers: one
    that overflows ends its question, see runner.answer_question)."""
    if not context:
        return
    for q in questions:
        n = len(chat_ids(tokenizer, [{"role": "user", "content": q.turns[0]}]))
        if n + 1 > context:
            raise ContextLimitError(f"{source}: question {q.question_id} has a {n}-token prompt; the target's context "
                                    f"is {context} tokens (drop it, or raise model.max_context up to the model's limit)")
