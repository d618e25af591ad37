"""Answer checkers: is one model output right? GSM8K and Math500 in-process; HumanEval and MBPP build a
program (completion + the dataset's tests) that sandbox.py runs.

Math500 uses math-verify (the `[quality]` extra) when it is installed; without it, a string normaliser
compares the last \\boxed{} answer with the reference (stricter: equivalent forms may count as wrong).
`MATH_CHECKER` says which one is in use.
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal, InvalidOperation

try:
    from math_verify import parse as _mv_parse, verify as _mv_verify

    MATH_CHECKER = "math-verify"
except ImportError:  # pragma: no cover - exercised only without the [quality] extra
    _mv_parse = _mv_verify = None
    MATH_CHECKER = "normaliser"

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


# ---------------------------------------------------------------- shared


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) with balanced braces; None if there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


# ---------------------------------------------------------------- GSM8K


def gsm8k_reference(answer: str) -> str:
    """The final number of a GSM8K worked solution: the text after '#### '."""
    return answer.split("####")[-1].strip() if "####" in answer else answer.strip()


def extract_number(text: str) -> str | None:
    """The model's final number: in the last \\boxed{}, else after '####', else after 'answer is' / 'Answer:',
    else the last number in the text."""
    candidates = (
        (last_boxed(text), -1),  # \\boxed{3 \\times 6 = 18}: the last number
        (text.split("####")[-1] if "####" in text else None, 0),
        (_after_answer_phrase(text), 0),  # "the answer is 18. Then ...": the first number after it
        (text, -1),
    )
    for candidate, pick in candidates:
        numbers = _NUMBER.findall(_strip_latex(candidate)) if candidate else []
        if numbers:
            return numbers[pick]
    return None


def _after_answer_phrase(text: str) -> str | None:
    m = list(re.finditer(r"(?:answer is|answer:)\s*(.{0,60})", text, flags=re.IGNORECASE))
    return m[-1].group(1) if m else None


def _strip_latex(s: str) -> str:
    s = re.sub(r"\\(?:text|mathrm|textbf|mbox)\{([^{}]*)\}", r"\1", s)
    return s.replace("\\$", "").replace("$", "").replace("\\,", "").replace("\\!", "")


def same_number(a: str | None, b: str | None) -> bool:
    x, y = _decimal(a), _decimal(b)
    return x is not None and y is not None and abs(x - y) < Decimal("1e-6")


def _decimal(s: str | None) -> Decimal | None:
    if s is None:
        return None
    s = s.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        return Decimal(s)
    except InvalidOperation:
        return None


def score_gsm8k(output: str, reference: str) -> bool:
    """Right when the model's final number equals the reference number (after '#### ' if present)."""
    return same_number(extract_number(output), gsm8k_reference(reference))


# ---------------------------------------------------------------- Math500


def score_math(output: str, reference: str) -> bool:
    """Right when the model's answer (its last \\boxed{}) is mathematically equal to the reference."""
    if _mv_parse is not None:
        return _math_verify(output, reference)
    pred = last_boxed(output)
    return pred is not None and normalise_math(pred) == normalise_math(reference)


def _math_verify(output: str, reference: str) -> bool:
    timeout = 5 if threading.current_thread() is threading.main_thread() else None  # it uses SIGALRM
    try:
        gold = _mv_parse(f"${reference}$", parsing_timeout=timeout) or _mv_parse(f"\\boxed{{{reference}}}", parsing_timeout=timeout)
        boxed = last_boxed(output)
        pred = _mv_parse(f"\\boxed{{{boxed}}}" if boxed is not None else output, parsing_timeout=timeout)
        return bool(gold and pred and _mv_verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # math-verify raises on pathological input or timeouts: count as wrong
        return False


_MATH_DROP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "^\\circ", "^{\\circ}", "\\%", "%", "\\$", "$")


def normalise_math(s: str) -> str:
    """A careful-enough string form of a LaTeX answer (the fallback when math-verify is not installed)."""
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
    for token in _MATH_DROP:
        s = s.replace(token, "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = re.sub(r"^[a-zA-Z]=", "", s)
    s = re.sub(r"(\d),(\d{3})", r"\1\2", s)
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if m and int(m.group(2)) != 0:
        s = str(Decimal(m.group(1)) / Decimal(m.group(2)))
    d = _decimal(s)
    return str(d.normalize()) if d is not None else s


# ---------------------------------------------------------------- code (HumanEval, MBPP)

# Printed after the last test: a program that exits 0 early (`exit()`, `sys.exit(0)` in the model's code)
# never ran its tests and must not count as passed.
TESTS_DONE = "dflash-bench: every test ran"


def tests_passed(exit_ok: bool, stdout: str) -> bool:
    """A program built here passed when it exited 0 AND got past its last test."""
    return exit_ok and stdout.rstrip().endswith(TESTS_DONE)


_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str, function: str | None = None) -> str:
    """The model's code: the longest fenced block that defines `function` (else the longest block; else the
    whole text when it has no fences), without a top-level `if __name__ == "__main__":` block."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return strip_main(text)
    defining = [b for b in blocks if function and re.search(rf"def\s+{re.escape(function)}\s*\(", b)]
    return strip_main(max(defining or blocks, key=len))


def strip_main(code: str) -> str:
    out, skipping = [], False
    for line in code.splitlines():
        if re.match(r"if\s+__name__\s*==\s*['\"]__main__['\"]\s*:", line):
            skipping = True
            continue
        if skipping and line.strip() and not line[0].isspace():
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


def humaneval_program(output: str, prompt: str, test: str, entry_point: str) -> str:
    """Completion + the task's `check`: the model's function when it wrote one (after the prompt's imports),
    else the prompt continued by the model's text."""
    code = extract_code(output, entry_point)
    if re.search(rf"def\s+{re.escape(entry_point)}\s*\(", code):
        imports = "\n".join(line for line in prompt.splitlines() if re.match(r"(?:import|from)\s", line))
        body = imports + "\n\n" + code
    else:
        body = prompt + code
    return f"{body}\n\n{test}\n\ncheck({entry_point})\nprint({TESTS_DONE!r})\n"


def mbpp_program(output: str, test_list: list[str], test_imports: list[str] | None = None, test_setup_code: str = "") -> str:
    """The task's imports, the model's code, then the task's asserts."""
    m = re.search(r"assert\s+(?:not\s+)?\(?\s*(?:set\(|math\.isclose\()?\s*([A-Za-z_]\w*)\s*\(", test_list[0]) if test_list else None
    code = extract_code(output, m.group(1) if m else None)
    head = "\n".join(test_imports or [])
    return f"{head}\n{test_setup_code}\n{code}\n\n" + "\n".join(test_list) + f"\nprint({TESTS_DONE!r})\n"
