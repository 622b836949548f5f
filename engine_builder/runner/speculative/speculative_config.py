"""How a run speculates: which proposer, how many draft tokens. Checked before any engine is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine_builder.util.errors import InputError

Method = Literal["ngram", "draft"]
METHODS: tuple[str, ...] = ("ngram", "draft")
# adaptive mode's ceiling: 15 drafts, a 16-token verify step (the graph's default logits_tail), which costs
# ~1.7-2.2 plain steps on the 2-core CPU. ngram: in the middle of a copy such drafts are mostly accepted;
# draft: an int4 draft holding the target's own weights (`convert --quant gguf`) agrees on ~100 % of tokens,
# and k=11 decoded 2.0x plain where k=4 gave 1.5x (benchmarks/speculative.py). The measured acceptance and
# costs pick the length below it (draft_length.py)
DEFAULT_MAX_DRAFT_TOKENS = {"ngram": 15, "draft": 15}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: Method
    draft_engine: str | None = None  # draft: an engine dir whose tokenizer is the target's
    # fixed number of draft tokens per verify step; None = adaptive (from the acceptance rate and the
    # measured cost of a verify step, up to max_draft_tokens; falls back to plain decoding when drafts
    # keep failing, so the worst case stays close to decoding without speculation)
    num_draft_tokens: int | None = None
    max_draft_tokens: int | None = None  # None: DEFAULT_MAX_DRAFT_TOKENS of the method
    ngram_max: int = 8  # ngram: the longest suffix match looked for in the prompt and output so far
    ngram_min: int = 2  # shorter matches propose nothing (one shared token is mostly a common word)
    draft_backend: str = "auto"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"speculative method {self.method!r} is not one of {', '.join(METHODS)} (or off)")
        if self.method == "draft" and not self.draft_engine:
            raise InputError("--speculative draft needs --draft-engine DIR (an engine dir built from a model "
                             "with the same tokenizer, e.g. an int4 build of the same checkpoint)")
        if self.method != "draft" and self.draft_engine:
            raise InputError(f"--draft-engine is only used with --speculative draft, not {self.method}")
        if self.draft_engine and not (Path(self.draft_engine) / "config.json").is_file():
            raise InputError(f"--draft-engine {self.draft_engine} is not an engine dir (no config.json); build one "
                             "with `trtbuild build <ckpt-dir> <draft-dir>`")
        for name in ("num_draft_tokens", "max_draft_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InputError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise InputError(f"ngram sizes need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")

    @property
    def adaptive(self) -> bool:
        return self.num_draft_tokens is None

    @property
    def draft_cap(self) -> int:
        if self.num_draft_tokens is not None:
            return self.num_draft_tokens
        return self.max_draft_tokens if self.max_draft_tokens is not None else DEFAULT_MAX_DRAFT_TOKENS[self.method]

    @classmethod
    def of(cls, value: SpeculativeConfig | str | None, **fields) -> SpeculativeConfig | None:
        """LLM(..., speculative=...) accepts a config, a method name, or None (off)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            return cls(value, **fields)  # type: ignore[arg-type]
        raise InputError(f"speculative must be 'ngram', 'draft' or a SpeculativeConfig, got {type(value).__name__}")


def from_flags(method: str | None, draft_engine: str | Path | None = None,
               num_draft_tokens: int | None = None, engine_dir: str | Path | None = None) -> SpeculativeConfig | None:
    """`--speculative / --draft-engine / --num-draft-tokens` as one config (None: speculation off). Without
    --speculative, ENGINE_DIR's runtime.json (a recipe's runtime.speculative block) decides; `off` overrides it."""
    if method is None or method == "off":
        if draft_engine is not None or num_draft_tokens is not None:
            raise InputError("--draft-engine and --num-draft-tokens need --speculative ngram|draft")
        if method is None and engine_dir is not None and (Path(engine_dir) / "config.json").is_file():
            from engine_builder.formats.runtime_config import read_runtime

            spec = read_runtime(Path(engine_dir)).speculative
            if spec is not None:
                return SpeculativeConfig(spec.method, spec.draft_engine, spec.num_draft_tokens)
        return None
    return SpeculativeConfig(method, str(draft_engine) if draft_engine is not None else None,  # type: ignore[arg-type]
                             num_draft_tokens)
