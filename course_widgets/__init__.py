"""Widgets and plotting helpers for the Attention & Transformers notebooks.

One module per topic (``attention``, ...), sharing ``base.Explorer``. Every
widget takes the learner's own functions as arguments and shows them at work.
``predict`` asks a predict-then-run question before a demo cell (no figure, same conventions).
"""

from .base import Explorer, LearnerFunctionProblem, call_learner, explain_unfinished, grading_now

__all__ = ["Explorer", "LearnerFunctionProblem", "call_learner", "explain_unfinished", "grading_now"]
