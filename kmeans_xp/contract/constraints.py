"""Constraints as data: what a parameter or a backend option takes, and the sentence that
says so in an error (`Interval`, `Options`, `Check`). Estimators' parameters and backends'
`Option`s use the same ones."""
from __future__ import annotations

import numbers


class Interval:
    def __init__(self, kind, low, high=None, closed="both"):
        self.kind, self.low, self.high, self.closed = kind, low, high, closed

    def __call__(self, v):
        if isinstance(v, bool) or not isinstance(v, self.kind):
            return False
        lo_ok = self.low is None or (v >= self.low if self.closed in ("both", "left")
                                     else v > self.low)
        hi_ok = self.high is None or v <= self.high
        return lo_ok and hi_ok

    def __str__(self):
        kind = "an int" if self.kind is numbers.Integral else "a float"
        left = "[" if self.closed in ("both", "left") else "("
        return f"{kind} in the range {left}{self.low}, {self.high if self.high else 'inf'})"


class Options:
    def __init__(self, *values):
        self.values = values

    def __call__(self, v):
        return isinstance(v, str) and v in self.values

    def __str__(self):
        return "a str among " + ", ".join(repr(v) for v in self.values)


class Check:
    def __init__(self, fn, text):
        self.fn, self.text = fn, text

    def __call__(self, v):
        return self.fn(v)

    def __str__(self):
        return self.text
