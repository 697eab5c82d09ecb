"""A command agent: its task and the endpoint come through its environment, its answer through a file."""

import json
import os
import sys

import openai

task = json.loads(os.environ["OMRL_TASK"])
if task["prompt"].startswith("crash"):
    print("this agent cannot handle crashes", file=sys.stderr)
    sys.exit(3)
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
reply = client.chat.completions.create(
    model=os.environ["OMRL_MODEL"], messages=[{"role": "user", "content": task["prompt"]}], max_tokens=8
)
with open(os.environ["OMRL_RESULT_FILE"], "w") as result:
    json.dump({"answer": json.load(open(os.environ["OMRL_TASK_FILE"]))["prompt"].split()[-1]}, result)
