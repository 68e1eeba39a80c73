"""Answer extraction and normalisation for the grader: pure text functions, bounded.

What runs in the caller's process must be cheap on any input, because no timeout can stop it:

- extraction (:func:`extract_answer`) is linear in the text it reads, and the grader passes it
  at most the last :data:`MAX_RESPONSE_CHARS` characters of a response;
- an extracted answer (or a reference) longer than :data:`MAX_ANSWER_CHARS` is not an answer;
- normalisation (:func:`normalize_answer`) calls lm-eval's ``normalize_final_answer``, whose
  regexes are quadratic in the worst case (about 0.15 s at 4096 characters), so the grader runs
  it in-process only on answers of at most :data:`NORMALIZE_IN_PROCESS_CHARS` characters
  (about 2 ms at worst) and in its time-limited worker for longer ones.
"""

from __future__ import annotations

import re
from fractions import Fraction

from entrogym.envs.minerva import minerva

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_RESPONSE_CHARS",
    "NORMALIZE_IN_PROCESS_CHARS",
    "as_number",
    "extract_answer",
    "fast_verdict",
    "last_number",
    "minerva_final_answer",
    "normalize_answer",
]

MAX_ANSWER_CHARS = 4096  # longer "answers" are not answers
# Extraction reads at most the last MAX_RESPONSE_CHARS characters of a response (where its final
# answer stands): about 250k tokens, beyond any context entrogym runs.
MAX_RESPONSE_CHARS = 1_000_000
NORMALIZE_IN_PROCESS_CHARS = 512

_FINAL_RE = re.compile(r"final answer\s*(?:is|:)[ \t:]*([^\n]*)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"[-−]?\d[\d,]*(?:\.\d+)?")
_UNIT_WORD_RE = re.compile(
    r"^([-+]?\d[\d,]*(?:\.\d+)?)\s*(?:\\(?:text|mbox|mathrm)\{[^{}]*\}|[A-Za-z]+\.?)$"
)


def _last_box(text: str) -> str | None:
    """Content of the last ``\\boxed``/``\\fbox`` (braced, or ``\\boxed 5`` up to ``$``/newline).

    lm-eval's ``last_boxed_only_string`` prefers any ``\\boxed `` over a later ``\\boxed{`` and
    any ``\\boxed`` over a later ``\\fbox``, so the last box would not always win.
    """
    i = _after_last_box_command(text)
    if i is None:
        return None
    if i < len(text) and text[i] == "{":
        depth = 0
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j]
        return None  # unclosed: the response was cut inside its answer
    if i < len(text) and text[i] == " ":
        rest = text[i + 1 :]
        return re.split(r"[$\n]", rest, maxsplit=1)[0].strip() or None
    return None


def _after_last_box_command(text: str) -> int | None:
    """Index just past the last ``\\boxed`` or ``\\fbox`` not followed by a letter, or None.

    Searched backwards (linear: each name's search resumes before its last hit, and the names
    cannot overlap), so a text full of boxes costs no list of matches."""
    best = -1
    for name in ("\\boxed", "\\fbox"):
        end = len(text)
        while (i := text.rfind(name, 0, end)) >= 0:
            j = i + len(name)
            if j == len(text) or not (text[j].isascii() and text[j].isalpha()):
                best = max(best, j)
                break
            end = i
    return None if best < 0 else best


_MINERVA_PREFIX = "Final Answer: The final answer is"
_MINERVA_SUFFIX = " I hope it is correct"


def minerva_final_answer(text: str) -> str | None:
    """lm-eval's ``get_unnormalized_answer`` in linear time; None where it gives
    ``"[invalidanswer]"``.

    lm-eval appends "I hope it is correct." and searches
    ``Final Answer: The final answer is(.*?). I hope it is correct.`` (each ``.`` any character
    but a newline). Python's regex engine retries the lazy group from every occurrence of the
    prefix to the end of its line: quadratic on a response that repeats the phrase. The match
    lies within one line, and on a line only the first occurrence of the prefix can match (a
    later one sees a subset of the same suffix positions), so one ``find`` per line gives the
    same answer.
    """
    text += "I hope it is correct."
    pos = 0
    while (i := text.find(_MINERVA_PREFIX, pos)) >= 0:
        start = i + len(_MINERVA_PREFIX)
        eol = text.find("\n", start)
        eol = len(text) if eol < 0 else eol
        # the suffix needs one character before it (the first ".") and one after it
        j = text.find(_MINERVA_SUFFIX, start + 1, eol)
        if j >= 0 and j + len(_MINERVA_SUFFIX) < eol:
            return text[start : j - 1].strip()
        pos = eol + 1
    return None


def _final_answer_phrase(text: str) -> str | None:
    found = minerva_final_answer(text)
    if found is not None:
        return found or None
    matches = list(_FINAL_RE.finditer(text))
    for match in reversed(matches):
        answer = re.split(r"\.\s", match.group(1), maxsplit=1)[0].strip().rstrip(".").strip()
        if answer:
            return answer
    return None


def extract_answer(response: str, *, allow_bare_number: bool = False) -> str | None:
    """The response's final answer: last box, else "final answer is X", else (when
    ``allow_bare_number``) the last number in the text; None when there is none.

    Linear time in the length of ``response``; :func:`grade` passes at most its last
    :data:`MAX_RESPONSE_CHARS` characters."""
    boxed = _last_box(response)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    phrase = _final_answer_phrase(response)
    if phrase is not None:
        return phrase
    return last_number(response) if allow_bare_number else None


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (digits, with a sign, thousands commas and a
    decimal part), or None: the answer of a model too small to box or tag it."""
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1].rstrip(",") if numbers else None


def normalize_answer(answer: str) -> str:
    """lm-eval's ``normalize_final_answer`` after rules it lacks (see the module docstring)."""
    s = answer.strip().replace("−", "-")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"(?<=\d)\\[,;!]\s*(?=\d{3})", "", s)  # 1\,000 -> 1000
    s = s.strip().rstrip(".").strip()
    unit = _UNIT_WORD_RE.match(s)
    if unit:
        s = unit.group(1)
    s = minerva().normalize_final_answer(s).strip().rstrip(".")
    # "{7}" and "((7))" are 7; "(1,2)" stays a tuple. A few layers at most: each check is linear.
    for _ in range(8):
        if not (
            len(s) >= 2
            and (
                (s[0] == "{" and s[-1] == "}" and _balanced(s[1:-1], "{}"))
                or (s[0] == "(" and s[-1] == ")" and "," not in s and _balanced(s[1:-1], "()"))
            )
        ):
            break
        s = s[1:-1]
    return s


def _balanced(s: str, pair: str) -> bool:
    depth = 0
    for ch in s:
        if ch == pair[0]:
            depth += 1
        elif ch == pair[1]:
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


_INT_RE = re.compile(r"[+-]?\d+")
_DEC_RE = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)")
_FRAC_RE = re.compile(r"([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}")
_SLASH_RE = re.compile(r"([+-]?\d+)/(\d+)")


def as_number(s: str) -> Fraction | None:
    """Exact value of a plain integer, decimal or integer fraction; None for anything else."""
    s = s.replace(" ", "")
    if not s or len(s) > 1000:
        return None
    try:
        if _INT_RE.fullmatch(s) or _DEC_RE.fullmatch(s):
            return Fraction(s)
        if m := _FRAC_RE.fullmatch(s):
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) == "-" else value
        if m := _SLASH_RE.fullmatch(s):
            return Fraction(int(m.group(1)), int(m.group(2)))
    except (ValueError, ZeroDivisionError):
        return None
    return None


def fast_verdict(answer: str, reference: str) -> tuple[bool, str] | None:
    """The verdict on two normalised answers without sympy, or None when sympy must decide:
    equal strings (``exact``), or two plain numbers compared as exact rationals (``numeric``)."""
    if answer == reference:
        return True, "exact"
    a, r = as_number(answer), as_number(reference)
    if a is not None and r is not None:
        return a == r, "numeric"
    return None
