"""An OpenAI tool call through `trtbuild serve`: the model asks for get_weather, we run it, it answers.

With tool_choice "required" (the default here) the server grammar-constrains the model's output to a call
whose arguments match the function's JSON schema (finish_reason "tool_calls"; parallel_tool_calls=False: at
most one); "auto" lets the model choose between a call and a plain answer. The tool's result goes back as a
{"role": "tool"} message and the model answers in words (SmolLM2-135M often just echoes the result back;
larger models phrase it). Starts its own server like openai_client.py (whose `served()` it uses), or takes
--base-url.

    .venv/bin/python examples/tools.py build/demo/smollm2-engine
    .venv/bin/python examples/tools.py --base-url http://127.0.0.1:8000 --city Tokyo --tool-choice auto
"""

import argparse
import json

from openai_client import served

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}


def get_weather(city: str) -> dict:
    return {"city": city, "celsius": 21, "sky": "sunny"}  # a stand-in for a real weather service


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("engine_dir", nargs="?", help="an engine dir to serve (or give --base-url)")
parser.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8000")
parser.add_argument("--city", default="Paris")
parser.add_argument("--tool-choice", default="required", choices=["required", "auto"])
args = parser.parse_args()
if not (args.engine_dir or args.base_url):
    parser.error("give ENGINE_DIR or --base-url")

with served(args.engine_dir, args.base_url) as client:
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": f"What is the weather in {args.city}?"}]
    reply = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER],
                                           tool_choice=args.tool_choice, parallel_tool_calls=False,  # one call
                                           temperature=0, max_tokens=128)
    message = reply.choices[0].message
    print(f"finish_reason={reply.choices[0].finish_reason}")
    if not message.tool_calls:
        print(f"no tool call; the model answered: {message.content}")
        raise SystemExit(0)
    messages.append(message.model_dump(exclude_none=True))      # the assistant's turn, with its calls
    for call in message.tool_calls:
        arguments = json.loads(call.function.arguments)           # matches the parameters schema
        print(f"tool call: {call.function.name}({json.dumps(arguments)})")
        result = get_weather(**arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    final = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], temperature=0,
                                           max_tokens=64)
    print(f"answer: {final.choices[0].message.content}")
