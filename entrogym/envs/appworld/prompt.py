"""The first observation of an AppWorld episode and the parsing of the agent's code.

The prompt follows the structure of AppWorld's own ReAct prompt (the supervisor's identity,
the three API-discovery calls, the working rules, then the task); the code blocks of each
action are what gets executed.
"""

from __future__ import annotations

import re
from typing import Any

PROMPT = """\
I am your supervisor and you are a super intelligent AI assistant whose job is to achieve my \
day-to-day tasks completely autonomously.

To do this, you will interact with apps (e.g., spotify, venmo) through their APIs on my behalf, \
in a multi-step conversation with a Python REPL: you write Python code, the environment runs it \
and shows you the output, and you write the code of the next step, until the task is done. \
Variables persist between steps.

Three APIs tell you everything else:

```python
# The apps available to you.
print(apis.api_docs.show_app_descriptions())

# The APIs of one app, e.g. spotify.
print(apis.api_docs.show_api_descriptions(app_name='spotify'))

# The specification of one API, e.g. spotify's login.
print(apis.api_docs.show_api_doc(app_name='spotify', api_name='login'))
```

Key instructions:
(1) Put your code in a ```python ... ``` block; write one small block per step.
(2) Use the "supervisor" app for my account passwords, addresses and payment cards, and the \
"phone" app for my friends and family.
(3) Read an API's specification with apis.api_docs.show_api_doc before calling it.
(4) Many APIs return results in pages: loop over page_index until a page comes back empty.
(5) Check that everything works before making any irreversible change.
(6) When the task is done, call apis.supervisor.complete_task(). If the task asks for \
information, pass it as the answer: apis.supervisor.complete_task(answer=<answer>); otherwise \
call it without arguments.

Using these APIs, now write code to solve the actual task.

My name is {first_name} {last_name}. My personal email is {email} and my phone number is \
{phone_number}.
Task: {instruction}"""

NO_CODE_FEEDBACK = (
    "No Python code block found in your reply. Write the code of your next step inside a "
    "```python ... ``` block (call apis.supervisor.complete_task() when the task is done)."
)

_FENCED = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_OPEN_AT_END = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*)\Z", re.DOTALL | re.IGNORECASE)


def first_observation(task: dict[str, Any]) -> str:
    """The prompt for an ``/initialize`` answer (instruction + supervisor)."""
    sup = task["supervisor"]
    return PROMPT.format(
        first_name=sup["first_name"],
        last_name=sup["last_name"],
        email=sup["email"],
        phone_number=sup["phone_number"],
        instruction=task["instruction"],
    )


def extract_code(action: str) -> str | None:
    """The action's Python code blocks joined in order, or None when it has none.

    A ```python block left open at the end (a generation cut at its token budget) counts too.
    """
    blocks = [b.strip("\n") for b in _FENCED.findall(action)]
    if not blocks:
        open_block = _OPEN_AT_END.search(action)
        if open_block:
            blocks = [open_block.group(1).strip("\n")]
    blocks = [b for b in blocks if b.strip()]
    return "\n\n".join(blocks) if blocks else None


def clip_output(text: str, max_chars: int) -> str:
    """Keep the head and tail of an over-long output, saying how much was cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars * 3 // 4
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... output truncated: {cut} characters omitted ...]\n{text[-tail:]}"
