"""Request bodies of the OpenAI-compatible routes (pydantic; a bad field is a 400 naming it).

Unknown top-level fields are accepted and ignored, as vLLM does (clients send fields a server may not
know, e.g. newer OpenAI options); a known field of the wrong type is a 400 naming it (in the message and
in error.param), as OpenAI answers it. Types are strict, as OpenAI checks them: "0.5" is not a number,
"true" not a boolean, 2.0 not an integer (an integer is a number). top_k, min_p,
repetition_penalty and the guided_* fields are accepted as extensions, with vLLM's names.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine_builder.server.chat_tokens import IMAGE_MARK
from engine_builder.server.schema_types import Text
from engine_builder.server.structured_output import ResponseFormat
from engine_builder.server.tool_calls import Tool, ToolCall, ToolChoice


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: Text | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Text | list[Text] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    user: Text | None = None  # an end-user id for abuse tracking upstream: accepted, unused
    logit_bias: dict[str, float] | None = None  # {"token id": bias in [-100, 100]}
    # extensions (vLLM's names)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    priority: int | None = None  # scheduling: lower runs first, 0 by default (vLLM's extension)
    # structured output (server/structured_output.py)
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | Text | None = None  # vLLM's extensions
    guided_regex: Text | None = None
    guided_choice: list[Text] | None = None


class CompletionRequest(SamplingFields):
    prompt: Text | list[Text] | list[int] | list[list[int]] = Field(description="one prompt: text, [text], "
                                                                                 "token ids or [token ids]")
    max_tokens: int | None = None
    logprobs: int | None = Field(None, ge=0, description="the sampled token's logprob + this many alternatives "
                                                         "(at most the server's --max-top-logprobs, 20 by default)")
    echo: bool = False  # with logprobs: the prompt's tokens get logprobs too (first one null)
    suffix: Text | None = None  # insertion: refused


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: Text


class ImageUrl(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: Text = Field(description="data:image/png;base64,... (the server fetches no http(s) URL)")
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the model's processor decides the size


class ImagePart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["image_url"]
    image_url: ImageUrl


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # a client echoes back assistant messages with fields of its own

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # None: an assistant turn that only called tools; image parts for a vision-language model
    content: Text | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls (server/tool_calls.py)
    tool_call_id: Text | None = None  # a tool message answers this call

    def text(self) -> str:
        """The content as text, each image part as IMAGE_MARK (where its image token goes: chat_tokens.py)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content.replace(IMAGE_MARK, "")
        return "".join(IMAGE_MARK + "\n" if isinstance(p, ImagePart) else p.text.replace(IMAGE_MARK, "")
                       for p in self.content)  # llava's "<image>\n"

    def images(self) -> list[str]:
        """The image parts' URLs, in order."""
        return [p.image_url.url for p in self.content or () if isinstance(p, ImagePart)] \
            if isinstance(self.content, list) else []


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens; both work
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, description="alternatives per token (at most the server's "
                                                             "--max-top-logprobs, 20 by default)")
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None  # default: auto with tools, none without
    parallel_tool_calls: bool | None = None  # false: "required" returns exactly one call
