"""Request bodies of the OpenAI-compatible routes (pydantic; a bad field is a 422 naming it).

Unknown fields are refused rather than ignored, so a typo or a feature this server lacks (tools,
response_format, logit_bias, n > 1 ...) is an error instead of silently different output.
top_k, min_p and repetition_penalty are accepted as extensions, with vLLM's names.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    user: str | None = None  # an end-user id for abuse tracking upstream: accepted, unused
    # extensions (vLLM's names)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] = Field(description="one prompt: text, [text] or token ids")
    max_tokens: int | None = None
    logprobs: int | None = Field(None, ge=0, le=20, description="the sampled token's logprob + this many "
                                                                "alternatives")
    echo: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens; both work
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
