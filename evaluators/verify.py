"""Answer extraction and verification: the one verifier used both as benchmark score and as training reward.

Three answer kinds:

- ``number`` (GSM8K style): the answer after ``####``, else the last ``\\boxed{}``, else "the answer is N", else the
  last number in the text; commas, currency, units, ``%`` and a trailing period are ignored; compared exactly as
  rationals (``18.00`` equals ``18``, ``1,000`` equals ``1000``, ``3/4`` equals ``0.75``).
- ``integer`` (AIME / AMC): the last ``\\boxed{}`` first, then as ``number``; ``27.0`` equals ``27``, ``025``
  equals ``25``.
- ``latex`` (MATH and friends): the last ``\\boxed{}`` (nested braces; ``\\fbox`` / ``\\framebox`` too), else
  "final answer is $X$", else a completion made only of math spans, else the last number. Equal after a light
  normalisation, or equal as plain numbers, or judged equal by math-verify.

math-verify runs in a small pool of child processes (`evaluators/_mv_worker.py`); a comparison that passes its
deadline kills its child and counts as wrong. This works from any thread and in worker processes, unlike
math-verify's own SIGALRM timeout. Number-only comparisons never reach the pool.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

KINDS = ("number", "integer", "latex")

# ---------------------------------------------------------------------------------------------- extraction helpers

_BOX_RE = re.compile(r"\\(?:boxed|fbox|framebox)\b")
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
# a number in running text: optional sign (not a minus between two operands), thousands commas, decimals, fractions
_TEXT_NUM_RE = re.compile(rf"(?<![\w.)\]}}])-?(?:{_NUM})(?:\s*/\s*\d+)?(?![\d])")
_ANSWER_PHRASE_RE = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:|=)\s*:?\s*(.+)", re.IGNORECASE)
_MATH_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox`` / ``\\framebox``) with balanced braces, or None."""
    for match in reversed(list(_BOX_RE.finditer(text))):
        i = match.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{" and text[j - 1] != "\\":
                    depth += 1
                elif text[j] == "}" and text[j - 1] != "\\":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1:j].strip()
            continue  # unbalanced: try an earlier box
        if i > match.end():  # `\boxed 5`: up to the next space or `$`
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                return token.group(0)
    return None


def has_answer_marker(completion: str) -> bool:
    """Whether ``completion`` states its final answer in an explicit answer form: a ``#### x`` line (GSM8K's, not a
    markdown heading) or a non-empty ``\\boxed{x}``, the forms every answer kind reads before its fallbacks (an
    answer phrase, the last number). GDPO's format component (``algorithms.advantages.REWARD_COMPONENTS``); it says
    nothing of whether the answer is right."""
    text = completion or ""
    if any(h.strip() and not h.strip()[:1].isalpha() for h in re.findall(r"####[ \t]*([^\n]*)", text)):
        return True
    boxed = last_boxed(text)
    return boxed is not None and bool(boxed.strip())


def strip_math_delimiters(s: str) -> str:
    """``$x$`` / ``$$x$$`` / ``\\(x\\)`` / ``\\[x\\]`` -> ``x``."""
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left):len(s) - len(right)].strip()
    return s


def join_math_spans(text: str) -> str | None:
    """``$69$, $84$`` / ``$a$ and $b$`` -> ``69, 84``: the spans joined, when only separators lie between them."""
    spans = list(_MATH_SPAN_RE.finditer(text))
    if not spans:
        return None
    outside = _MATH_SPAN_RE.sub(" ", text)
    if not re.fullmatch(r"[\s,;.]*(?:(?:and|or)[\s,;.]*)*", outside):
        return None
    return ", ".join(next(g for g in m.groups() if g is not None).strip() for m in spans)


def _answer_phrase(text: str) -> str | None:
    """The tail of the last 'answer is ...' / 'Answer: ...' line (first math span of it when it has one)."""
    matches = list(_ANSWER_PHRASE_RE.finditer(text))
    if not matches:
        return None
    tail = matches[-1].group(1).strip()
    tail = re.sub(r"\s*I hope it is correct\.?\s*$", "", tail, flags=re.IGNORECASE)
    joined = join_math_spans(tail)
    if joined:
        return joined
    span = _MATH_SPAN_RE.search(tail)
    if span:
        return next(g for g in span.groups() if g is not None).strip()
    tail = re.split(r"(?<=[^\d\s])\.\s", tail + " ")[0]  # up to the end of the sentence
    return tail.strip().rstrip(".").strip() or None


def _last_number(text: str) -> str | None:
    found = _TEXT_NUM_RE.findall(text)
    return found[-1].replace(" ", "") if found else None


def extract_answer(completion: str, kind: str) -> str | None:
    """The final answer a completion commits to (see the module docstring for the order of rules), or None."""
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; valid: {', '.join(KINDS)}")
    text = completion or ""
    if not text.strip():
        return None
    # `#### N` (GSM8K); a `####` line starting with a letter is a markdown heading, not an answer
    hashes = [h.strip() for h in re.findall(r"####[ \t]*([^\n]*)", text) if h.strip() and not h[:1].isalpha()]
    hashes_answer = hashes[-1] if hashes else None
    boxed = last_boxed(text)
    if kind == "number":
        raw = hashes_answer or boxed or _answer_phrase(text)
    else:
        raw = boxed or hashes_answer or _answer_phrase(text)
    if raw is None and kind == "latex":
        raw = join_math_spans(text)
    if raw is None:
        raw = _last_number(text)
    if raw is None:
        return None
    raw = strip_math_delimiters(raw).rstrip(".").strip()
    if kind in ("number", "integer"):
        value = to_number(raw)
        if value is None:  # "$1,000 in total", "18 eggs": the first number of the answer text
            first = _TEXT_NUM_RE.search(raw)
            value = to_number(first.group(0)) if first and not re.search(r"\\[a-zA-Z]", raw) else None
        if value is not None:
            return format_number(value)
    return raw or None


# ---------------------------------------------------------------------------------------------- numbers

_UNIT_WRAPPERS_RE = re.compile(r"\\(?:text|textbf|mbox|mathrm|rm)\s*\{[^{}]*\}")
# a plain number, optionally followed by unit words ("18 eggs", "5 cm"), never by a constant or operator word
_PLAIN_NUM_RE = re.compile(rf"([-+]?)({_NUM})(?:[eE]([-+]?\d+))?"
                           r"(?:\s+(?!(?:pi|sqrt|times|cdot|e)\b)[a-zA-Z]{2,}(?:[\s.]+[a-zA-Z]+)*)?")
# replaced in order before reading a number: currency, percent, degrees, LaTeX spacing and sizing
_NUMBER_NOISE = (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("{,}", ","), ("\\$", ""), ("$", ""),
                 ("\\%", ""), ("%", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\!", ""), ("\\,", ""),
                 ("\\;", ""), ("\\:", ""), ("\\ ", " "), ("\\left", ""), ("\\right", ""))
_FRAC_RE = re.compile(r"([-+]?)\\frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(-?\d+)\s*\}|([-+]?)\\frac\s*(\d)\s*(\d)|"
                      r"([-+]?)(\d+)\s*/\s*(\d+)")


def to_number(s: str) -> Fraction | None:
    """The exact value of a plain number answer (``$1,000.00``, ``18 eggs``, ``\\frac{3}{4}``, ``25\\%``), or None."""
    s = _UNIT_WRAPPERS_RE.sub(" ", s)
    for a, b in _NUMBER_NOISE:
        s = s.replace(a, b)
    s = s.strip().rstrip(".").strip()
    if s.startswith("(") and s.endswith(")") and s.count("(") == 1:
        s = s[1:-1].strip()
    m = _PLAIN_NUM_RE.fullmatch(s)
    if m:
        sign, digits, exponent = m.groups()
        value = Fraction(digits.replace(",", ""))
        if exponent:
            if abs(int(exponent)) > 400:  # not a plain number worth computing exactly
                return None
            value *= Fraction(10) ** int(exponent)
        return -value if sign == "-" else value
    m = _FRAC_RE.fullmatch(s)
    if m:
        g = m.groups()
        sign, num, den = next((g[i], g[i + 1], g[i + 2]) for i in (0, 3, 6) if g[i + 1] is not None)
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return -value if sign == "-" else value
    return None


def format_number(value: Fraction) -> str:
    """Canonical text of a number: ``18``, ``0.75``, ``-1/3``."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    while den % 2 == 0:
        den //= 2
    while den % 5 == 0:
        den //= 5
    if den == 1:  # terminating decimal
        text = f"{float(value):.15f}".rstrip("0")
        if Fraction(text) == value:
            return text
    return f"{value.numerator}/{value.denominator}"


# ---------------------------------------------------------------------------------------------- comparison

def normalize_latex(s: str) -> str:
    """A light, safe normalisation used for exact matches and majority-vote keys (not for semantic equality)."""
    s = strip_math_delimiters(s)
    s = re.sub(r"\\text\s*\{\s*([^{}]*?)\s*\}", r"\1", s)
    for a, b in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""), ("\\!", ""),
                 ("\\,", ""), ("\\;", ""), ("\\:", ""), ("\\ ", ""), ("^\\circ", ""), ("^{\\circ}", ""),
                 ("\\displaystyle", ""), ("{,}", ",")):
        s = s.replace(a, b)
    s = re.sub(r"\s+", "", s)
    return s.rstrip(".")


def answer_key(answer: str | None, kind: str) -> str | None:
    """Grouping key for majority voting: equal keys are equal answers (the converse needs `answers_match`)."""
    if answer is None:
        return None
    value = to_number(answer)
    if value is not None:
        return format_number(value)
    return normalize_latex(answer)


def answers_match(pred: str, reference: str, kind: str, timeout: float = 5.0) -> bool:
    """Whether an extracted answer equals the reference answer (math-verify only when the cheap checks cannot tell)."""
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; valid: {', '.join(KINDS)}")
    if not pred or not pred.strip():
        return False
    ref_value, pred_value = to_number(reference), to_number(pred)
    if ref_value is not None and pred_value is not None:
        return ref_value == pred_value
    if normalize_latex(pred) == normalize_latex(reference):
        return True
    if kind != "latex" and ref_value is not None:
        if re.fullmatch(r"[-+\d.,\s]*", pred):
            return False  # a number-like but unparseable prediction (e.g. "1,3,5") against a number
        if not re.search(r"[\d\\^]", pred):
            return False  # words without a digit or LaTeX cannot equal a number: no math-verify round trip
    return _math_verify_equal(reference, pred, float(timeout)) is True


def judge(completion: str, reference: str, kind: str, timeout: float = 5.0) -> tuple[str | None, bool]:
    """(extracted answer, correct?) of one completion: `is_correct` with the answer it extracted."""
    pred = extract_answer(completion, kind)
    return pred, pred is not None and answers_match(pred, reference, kind, timeout)


def is_correct(completion: str, reference: str, kind: str, timeout: float = 5.0) -> bool:
    """The verifier: does the completion's final answer equal the reference answer? (timeout -> False)"""
    return judge(completion, reference, kind, timeout)[1]


@functools.lru_cache(maxsize=65536)
def _math_verify_equal(gold: str, pred: str, timeout: float) -> bool | None:
    """math-verify's judgement in a child process; None when it passed the deadline."""
    return default_pool().compare(gold, pred, timeout)


# ---------------------------------------------------------------------------------------------- math-verify pool

_WORKER_PATH = str(Path(__file__).with_name("_mv_worker.py"))


class VerifierTimeout(Exception):
    """Raised inside the pool when a comparison passed its deadline (its child process has been killed)."""


class _Worker:
    """One child process running `_mv_worker.py`, spoken to through JSON lines on its stdin / stdout."""

    def __init__(self, startup_timeout: float):
        self.proc = subprocess.Popen([sys.executable, "-u", _WORKER_PATH], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        self._buffer = b""
        if self._read_line(startup_timeout) is None:
            self.kill()
            raise RuntimeError(f"the math-verify worker ({_WORKER_PATH}) did not start within {startup_timeout:.0f}s")

    def _read_line(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError(f"the math-verify worker exited (code {self.proc.poll()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def compare(self, gold: str, pred: str, timeout: float) -> bool:
        self.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
        self.proc.stdin.flush()
        reply = self._read_line(timeout)
        if reply is None:
            raise VerifierTimeout(f"math-verify took longer than {timeout}s on {pred!r} vs {gold!r}")
        return bool(reply["ok"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class MathVerifyPool:
    """Up to `max_workers` math-verify child processes shared by all threads of this process.

    A child is created on first need and reused; one that times out or dies is killed and replaced on the next
    call. After a fork the child process starts its own pool (it never touches its parent's children).
    """

    def __init__(self, max_workers: int = 2, startup_timeout: float = 120.0):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self.startup_timeout = startup_timeout
        self.timeouts = 0
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._count = 0

    def _acquire(self) -> _Worker:
        if os.getpid() != self._pid:
            self._reset()
        with self._cond:
            while not self._idle and self._count >= self.max_workers:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Worker(self.startup_timeout)
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        with self._cond:
            self._count -= 1
            self._cond.notify()

    def compare(self, gold: str, pred: str, timeout: float) -> bool | None:
        """math-verify(gold, pred) within `timeout` seconds, or None when it ran out of time."""
        worker = self._acquire()
        try:
            result = worker.compare(gold, pred, timeout)
        except VerifierTimeout:
            worker.kill()
            self._drop()
            with self._cond:
                self.timeouts += 1
            return None
        except BaseException:
            worker.kill()
            self._drop()
            raise
        with self._cond:
            self._idle.append(worker)
            self._cond.notify()
        return result

    def close(self) -> None:
        """Stop the idle children (busy ones are stopped by their caller)."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for worker in idle:
            worker.kill()


_DEFAULT_POOL: MathVerifyPool | None = None
_DEFAULT_POOL_LOCK = threading.Lock()


def default_pool() -> MathVerifyPool:
    """The process-wide pool (size from ``POBENCH_VERIFY_WORKERS``, default 2), created on first use."""
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = MathVerifyPool(max_workers=int(os.environ.get("POBENCH_VERIFY_WORKERS", "2")))
            atexit.register(_DEFAULT_POOL.close)
        return _DEFAULT_POOL
