"""A long-context set that needs no network: ShareGPT conversations concatenated into a document of a
chosen length, then a task about it. Lengths are whole prompts in the target's tokens (chat template
included), so `target_lengths=[1024,4096,16384]` measures speedup against context length."""

from __future__ import annotations

from dataclasses import dataclass, field

from tqdm.auto import tqdm

from ..errors import ConfigError
from ..weights import model_config, model_tokenizer
from .base import DATASETS, Question
from .sharegpt import conversations
from .sources import Selection

TASKS = (
    "Summarize the conversations above in five bullet points.",
    "What did the user ask first in the conversations above, and what was the answer?",
    "List every product, tool or programming language mentioned in the conversations above.",
    "Which of the conversations above is the most technical? Quote the passage that shows it.",
)


@dataclass
class LongContextOptions(Selection):
    target_lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096])  # prompt tokens
    per_length: int = 2  # questions per length
    tokenizer: str = "embedded:smollm2-135m-instruct"  # the target's path (the yaml interpolates ${model.path})
    max_context: int | None = None  # default: the target's max_position_embeddings
    reserve: int = 128  # tokens left for the answer (the yaml interpolates ${gen.max_new_tokens})
    skip: int = 0  # ShareGPT conversations skipped before the first document

    def __post_init__(self):
        super().__post_init__()
        if not self.target_lengths or any(n < 64 for n in self.target_lengths):
            raise ConfigError(f"dataset.target_lengths must be token counts >= 64, got {self.target_lengths}")
        if self.per_length < 1:
            raise ConfigError(f"dataset.per_length must be >= 1, got {self.per_length}")


def context_limit(opts: LongContextOptions) -> int | None:
    if opts.max_context:
        return opts.max_context
    config = model_config(opts.tokenizer)
    return getattr(config.get_text_config(), "max_position_embeddings", None) if config else None


def render(turns: list[tuple[str, str]]) -> str:
    return "\n\n".join(f"{'User' if who == 'human' else 'Assistant'}: {text}" for who, text in turns)


class DocumentBuilder:
    """Cuts consecutive ShareGPT conversations into documents of an exact prompt length."""

    def __init__(self, tokenizer, skip: int):
        self.tok = tokenizer
        self.source = (turns for n, (_, turns) in enumerate(conversations()) if n >= skip)

    def prompt_ids(self, document: str, task: str) -> list[int]:
        messages = [{"role": "user", "content": f"{document}\n\n{task}"}]
        return self.tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]

    def document(self, length: int, task: str) -> str:
        """Text whose prompt (template + document + task) is `length` tokens or a few fewer."""
        budget = length - len(self.prompt_ids("", task))
        ids: list[int] = []
        while len(ids) < budget:
            turns = next(self.source, None)
            if turns is None:
                raise ConfigError(f"ShareGPT ran out of text for a {length}-token document; lower dataset.skip")
            ids += self.tok.encode(render(turns) + "\n\n", add_special_tokens=False)
        text = self.tok.decode(ids[:budget])
        while (over := len(self.prompt_ids(text, task)) - length) > 0:  # re-tokenising may merge differently
            text = self.tok.decode(self.tok.encode(text, add_special_tokens=False)[: -over])
        return text


@DATASETS.register("long_context", LongContextOptions)
def long_context(opts: LongContextOptions) -> list[Question]:
    limit = context_limit(opts)
    too_long = [n for n in opts.target_lengths if limit and n + opts.reserve > limit]
    if too_long:
        raise ConfigError(f"dataset.target_lengths {too_long} plus {opts.reserve} answer tokens exceed the model's "
                          f"context ({limit} tokens)")
    builder = DocumentBuilder(model_tokenizer(opts.tokenizer), opts.skip)
    out = []
    with tqdm(total=len(opts.target_lengths) * opts.per_length, desc="long_context documents", unit="doc") as bar:
        for length in opts.target_lengths:
            for i in range(opts.per_length):
                task = TASKS[i % len(TASKS)]
                out.append(Question(f"len{length}-{i}", f"{length}_tokens", (f"{builder.document(length, task)}\n\n{task}",)))
                bar.update()
    return opts.apply(out)
