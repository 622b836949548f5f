"""Structured output: an answer constrained to a JSON schema (SamplingParams.json_schema), then validated.

The engine decodes under a grammar built from the schema (llguidance: a token mask per step), so an answer
that finishes (finish_reason "stop") always parses and matches it; one cut by --max-new-tokens may not, and
is refused here. jsonschema checks the answer independently. The server takes the same schema as OpenAI's
response_format={"type": "json_schema", ...} (docs/guide/structured-output.md).

    .venv/bin/python examples/structured_output.py build/demo/smollm2-engine
    .venv/bin/python examples/structured_output.py ENGINE_DIR --schema my.schema.json --prompt "..."
"""

import argparse
import json
import sys

import jsonschema

from engine_builder import LLM

# population is bounded: a small model may otherwise write digits until max_new_tokens
CITY = {"type": "object", "additionalProperties": False, "required": ["city", "country", "population"],
        "properties": {"city": {"type": "string", "maxLength": 40}, "country": {"type": "string", "maxLength": 40},
                       "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}}

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("engine_dir", help="an engine dir from `trtbuild build`")
parser.add_argument("--schema", help="a JSON schema file (default: a city, its country and population)")
parser.add_argument("--prompt", default="Describe the capital of France as JSON.")
parser.add_argument("--max-new-tokens", type=int, default=96)
args = parser.parse_args()
schema = json.load(open(args.schema)) if args.schema else CITY

with LLM(args.engine_dir) as llm:
    params = llm.default_params(max_new_tokens=args.max_new_tokens, temperature=0, json_schema=schema)
    out = llm.chat([{"role": "user", "content": args.prompt}], params)[0]
if out.finish_reason != "stop":
    sys.exit(f"the answer was cut at {len(out.token_ids)} tokens (raise --max-new-tokens): {out.text}")
answer = json.loads(out.text)
jsonschema.validate(answer, schema)  # raises on a mismatch; never does for a finished answer
print(json.dumps(answer))
print(f"valid against the schema ({len(out.token_ids)} tokens)", file=sys.stderr)
