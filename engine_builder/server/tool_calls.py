"""Tool calling on /v1/chat/completions: tools, tool_choice, tool_calls out, tool messages in.

    tool_choice "none"       the tools are not shown to the model; plain text comes back
    tool_choice "auto"       the tools are shown; the answer is text, or tool calls when the model
                             writes them (<tool_call>{"name": ..., "arguments": {...}}</tool_call>, the
                             Hermes/Qwen format, or one bare {"name", "arguments"} object)
    tool_choice "required"   the output is grammar-constrained to a JSON array of one or more calls
                             [{"name": <one of the tools>, "arguments": <that tool's parameters schema>}];
                             cut by max_tokens, the calls completed before the cut, finish_reason "length"
    {"type": "function", "function": {"name": F}}
                             the output is grammar-constrained to F's parameters schema: it is the
                             arguments (streamed as the arguments' deltas)

How the tools reach the model: a chat template that knows tools (it mentions `tools`) gets them as
apply_chat_template(tools=...), with assistant tool_calls and tool messages passed through; any
other template (SmolLM2's) gets a system message listing them in the Hermes format, assistant
tool calls rendered as <tool_call> blocks and tool results as <tool_response> blocks.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine_builder.server.http_errors import VALIDATION, ApiError
from engine_builder.server.schema_types import Text

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
# OpenAI's own limit; tool_choice "required" makes one grammar branch per tool (and the grammar limits
# of runner/grammar.py bound the schema they make together)
MAX_TOOLS = 128
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
TOOL_CALL_OPEN = "<tool_call>"
_DECODER = json.JSONDecoder()
_JSON_SPACE = re.compile(r"[ \t\n\r]*")


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: Text = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: Text


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: NamedFunction


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: Text
    arguments: Text


class ToolCall(BaseModel):
    """An assistant message's earlier tool call, sent back in the history."""

    model_config = ConfigDict(extra="ignore")

    id: Text | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # none, auto, required, named
    tools: tuple[Tool, ...]
    named: str | None = None
    parallel: bool = True  # parallel_tool_calls: false = at most one call with "required"

    @property
    def constrained(self) -> bool:
        return self.mode in ("required", "named")

    def constraint(self) -> dict[str, Any]:
        """SamplingParams keywords: the JSON schema the output must match (required / named)."""
        params = {t.function.name: t.function.parameters or EMPTY_PARAMETERS for t in self.tools}
        if self.mode == "named":
            return {"json_schema": params[self.named]}
        if self.mode == "required":
            calls = [{"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
                      "required": ["name", "arguments"], "additionalProperties": False}
                     for name, schema in params.items()]
            array = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
            return {"json_schema": array if self.parallel else {**array, "maxItems": 1}}
        return {}


def plan(tools: list[Tool] | None, choice: ToolChoice | None, parallel: bool | None = None) -> ToolPlan:
    tools = tuple(tools or ())
    if len(tools) > MAX_TOOLS:
        raise ApiError(VALIDATION, f"tools has {len(tools)} entries but this server takes at most {MAX_TOOLS}; "
                                   "send the ones this request may need")
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, NamedToolChoice):
        names = [t.function.name for t in tools]
        if choice.function.name not in names:
            raise ApiError(VALIDATION, f"tool_choice names function {choice.function.name!r}, which is not in tools "
                                       f"({', '.join(names) or 'none given'})")
        return ToolPlan("named", tools, choice.function.name)
    if choice in ("auto", "required") and not tools:
        raise ApiError(VALIDATION, f"tool_choice {choice!r} needs tools; give a tools list or leave tool_choice out")
    return ToolPlan(choice, tools if choice != "none" else (), parallel=parallel is not False)


def template_knows_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in template


def render(messages: list[Any], tool_plan: ToolPlan, native: bool) -> tuple[list[dict[str, Any]], list | None]:
    """The messages for the chat template, and the tools argument (native templates only)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        content = m.text()
        if native:
            entry: dict[str, Any] = {"role": role, "content": content}
            if m.tool_calls:
                entry["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": _loads_or_text(c.function.arguments)}} for c in m.tool_calls]
            if m.tool_call_id is not None:
                entry["tool_call_id"] = m.tool_call_id
            out.append(entry)
            continue
        if m.tool_calls:
            calls = "\n".join(_tool_call_block(c.function.name, c.function.arguments) for c in m.tool_calls)
            content = f"{content}\n{calls}" if content else calls
        if role == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    tools = [t.model_dump(exclude_none=True) for t in tool_plan.tools]
    if native:
        return out, tools or None
    if tools:
        prompt = _hermes_system(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, None


def _tool_call_block(name: str, arguments: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': _loads_or_text(arguments)})}\n</tool_call>"


def _hermes_system(tools: list[dict[str, Any]]) -> str:
    listed = "\n".join(json.dumps(t) for t in tools)
    return ("You may call one or more functions to assist with the user query. The functions are listed in "
            f"<tools></tools>:\n<tools>\n{listed}\n</tools>\nFor each function call, return a JSON object with the "
            "function name and arguments within <tool_call></tool_call> tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _loads_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def new_call(name: str, arguments: Any) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": text}}


def parse(text: str, tool_plan: ToolPlan) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a finished answer."""
    if tool_plan.mode == "named":
        return None, [new_call(tool_plan.named, text)]
    if tool_plan.mode == "required":
        # an array cut by max_tokens (a model that repeats its call until then) keeps the calls it completed
        calls = [c for c in _complete_items(text) if isinstance(c, dict) and "name" in c and "arguments" in c]
        if not calls:  # cut inside the first call: nothing complete to report
            return text, []
        return None, [new_call(c["name"], c["arguments"]) for c in calls]
    if tool_plan.mode != "auto":
        return text, []
    names = {t.function.name for t in tool_plan.tools}
    calls = []
    blocks = _TOOL_CALL.findall(text) if TOOL_CALL_OPEN in text else [text.strip()]
    for block in blocks:
        try:
            obj = json.loads(block)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("name") in names and isinstance(obj.get("arguments", {}), dict):
            calls.append(new_call(obj["name"], obj.get("arguments", {})))
    if not calls:
        return text, []
    content = text.split(TOOL_CALL_OPEN, 1)[0].strip() if TOOL_CALL_OPEN in text else ""
    return content or None, calls


def _complete_items(text: str) -> list[Any]:
    """The elements of the JSON array TEXT that are complete, whether the array is or not."""
    items: list[Any] = []
    at = _skip_space(text, 0)
    if not text.startswith("[", at):
        return items
    at += 1
    while True:
        try:
            item, at = _DECODER.raw_decode(text, _skip_space(text, at))
        except json.JSONDecodeError:
            return items
        items.append(item)
        at = _skip_space(text, at)
        if not text.startswith(",", at):
            return items
        at += 1


def _skip_space(text: str, at: int) -> int:
    return _JSON_SPACE.match(text, at).end()


def may_be_call(text: str) -> bool:
    """Whether streamed auto-mode text so far could still be a tool call: then it is held back and parsed
    at the end. Prose that starts otherwise streams as content (a call written after prose stays text)."""
    s = text.lstrip()
    return not s or s.startswith("{") or s.startswith(TOOL_CALL_OPEN) or TOOL_CALL_OPEN.startswith(s)


class StreamedChoice:
    """The chat stream's per-event choice for a request with tools: content deltas, or tool_calls deltas
    (a named function's arguments as they come; required / auto calls whole at the end)."""

    def __init__(self, tool_plan: ToolPlan, logprobs: Callable[[Any], Any]) -> None:
        self.plan, self.logprobs = tool_plan, logprobs
        self.text = ""  # all generated text so far
        self.sent = 0  # how much of it went out as content
        self.call: dict[str, Any] | None = None  # the named call, once its header was sent

    def __call__(self, delta: str, lp: Any, finish_reason: str | None) -> dict[str, Any]:
        self.text += delta
        out: dict[str, Any] = {}
        if self.plan.mode == "named":
            if self.call is None:
                self.call = new_call(self.plan.named, "")
                out["tool_calls"] = [{"index": 0, **self.call, "function": {"name": self.plan.named,
                                                                             "arguments": delta}}]
            elif delta:
                out["tool_calls"] = [{"index": 0, "function": {"arguments": delta}}]
            if finish_reason == "stop":
                finish_reason = "tool_calls"
        elif self.plan.mode == "none" or self.sent or (self.plan.mode == "auto" and not may_be_call(self.text)):
            out["content"] = self.text[self.sent:]
            self.sent = len(self.text)
        if finish_reason is not None and self.plan.mode in ("auto", "required") and not self.sent:
            content, calls = parse(self.text, self.plan)
            if calls:
                out["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
                finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
            elif content:
                out["content"] = content
        if out.get("content") == "":
            del out["content"]
        return {"index": 0, "delta": out, "logprobs": self.logprobs(lp) if lp else None,
                "finish_reason": finish_reason}
